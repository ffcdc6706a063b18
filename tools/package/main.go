// Command package builds Postern's .deb packages with nfpm (github.com/goreleaser/nfpm/v2, as a
// library): one package per nfpm config given, from binaries already built. It is a build
// tool, not part of the product, and lives in its own module so the product's go.mod does
// not carry nfpm's dependencies. scripts/package is how it is run.
//
//	go run . -out DIR -version V [-arch A] CONFIG.yaml...
//
// The configs (packaging/*.yaml) read $POSTERN_BIN (the dir holding the built binaries) and
// $VERSION, $ARCH from the environment this tool sets from its flags.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
)

func main() {
	out := flag.String("out", "dist", "directory the packages are written to")
	ver := flag.String("version", "", "package version (Debian: starts with a digit)")
	arch := flag.String("arch", runtime.GOARCH, "package architecture (Go's name: amd64, arm64)")
	bin := flag.String("bin", "", "directory holding the built binaries ($POSTERN_BIN in the configs)")
	flag.Parse()
	if *ver == "" || *bin == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: package -version V -bin DIR [-out DIR] [-arch A] CONFIG.yaml...")
		os.Exit(2)
	}
	env := map[string]string{"VERSION": *ver, "ARCH": *arch, "POSTERN_BIN": *bin}
	for _, cfg := range flag.Args() {
		path, err := build(cfg, *out, func(k string) string { return env[k] })
		if err != nil {
			fmt.Fprintf(os.Stderr, "package %s: %v\n", cfg, err)
			os.Exit(1)
		}
		fmt.Println(path)
	}
}

// build makes the deb package a config describes and returns its path.
func build(configPath, out string, env func(string) string) (string, error) {
	config, err := nfpm.ParseFileWithEnvMapping(configPath, env)
	if err != nil {
		return "", err
	}
	info, err := config.Get("deb")
	if err != nil {
		return "", err
	}
	info = nfpm.WithDefaults(info)
	pkg, err := nfpm.Get("deb")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	target := filepath.Join(out, pkg.ConventionalFileName(info))
	info.Target = target
	f, err := os.Create(target)
	if err != nil {
		return "", err
	}
	if err := pkg.Package(info, f); err != nil {
		f.Close()
		os.Remove(target)
		return "", err
	}
	if err := f.Close(); err != nil {
		os.Remove(target)
		return "", err
	}
	return target, nil
}
