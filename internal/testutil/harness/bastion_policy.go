package harness

import (
	"os"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/postern-dev/postern/bastion/transport"
)

// ActorSpec is a remote actor with the limits policy tests give it (zero values: no
// limit, as in the bastion config).
type ActorSpec struct {
	Name          string   `toml:"name"`
	Hosts         []string `toml:"hosts,omitempty"`
	Tools         []string `toml:"tools,omitempty"`
	MaxConcurrent int      `toml:"max_concurrent,omitempty"`
	DailyQuota    int      `toml:"daily_quota,omitempty"`
	// Per agent run (intent scope).
	RunMaxConcurrent int `toml:"run_max_concurrent,omitempty"`
	RunDailyQuota    int `toml:"run_daily_quota,omitempty"`
}

// AddActor configures one more remote actor with a fresh token (b.Tokens[spec.Name]), so
// that Connect can authenticate as it. Call it before Start. The config ends with the
// generated [[actors]] tables, so another one appended there stays a table of its own.
func (b *Bastion) AddActor(t testing.TB, spec ActorSpec) {
	t.Helper()
	if _, dup := b.Tokens[spec.Name]; dup {
		t.Fatalf("actor %q is already configured", spec.Name)
	}
	tok, err := transport.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	table := struct {
		Actors []any `toml:"actors"`
	}{Actors: []any{struct {
		ActorSpec
		TokenSHA256 string `toml:"token_sha256"`
	}{spec, transport.HashToken(tok)}}}
	f, err := os.OpenFile(b.ConfigPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n"); err != nil {
		t.Fatal(err)
	}
	if err := toml.NewEncoder(f).Encode(table); err != nil {
		t.Fatalf("add actor %s: %v", spec.Name, err)
	}
	b.Tokens[spec.Name] = tok
}
