// Command postern-plugin-http is the HTTP action channel, run by the bastion through go-plugin
// (never by hand, except `postern-plugin-http --version`). It performs one HTTP request per
// execution and journals each lifecycle point back into the bastion over the go-plugin broker.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/version"
	"github.com/postern-dev/postern/plugins"
	httpchannel "github.com/postern-dev/postern/plugins/http"
)

func main() {
	if len(os.Args) == 2 && cli.IsVersionFlag(os.Args[1]) {
		fmt.Println(version.Line("postern-plugin-http"))
		return
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugins.Handshake,
		Plugins: map[string]plugin.Plugin{
			plugins.ChannelHTTP: &plugins.ChannelPlugin{Impl: httpchannel.New(httpchannel.Options{Logger: newLogger()})},
		},
		GRPCServer: plugins.NewGRPCServer,
		Logger:     hclog.New(&hclog.LoggerOptions{Name: "postern-plugin-http", Output: os.Stderr, JSONFormat: true, Level: hclog.Info}),
	})
}

// newLogger writes slog records to stderr in hclog's JSON shape, which the bastion's go-plugin
// client parses and re-logs at the right level.
func newLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{
		Level: slog.LevelInfo,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.MessageKey:
				a.Key = "@message"
			case slog.LevelKey:
				a.Key = "@level"
				a.Value = slog.StringValue(hclogLevel(a.Value.Any()))
			case slog.TimeKey:
				a.Key = "@timestamp"
				if t, ok := a.Value.Any().(time.Time); ok {
					a.Value = slog.StringValue(t.Format("2006-01-02T15:04:05.000000Z07:00"))
				}
			}
			return a
		},
	}))
}

func hclogLevel(v any) string {
	l, ok := v.(slog.Level)
	if !ok {
		return fmt.Sprint(v)
	}
	switch {
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warn"
	default:
		return "error"
	}
}
