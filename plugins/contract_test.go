package plugins_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/postern-dev/postern/plugins"
)

func TestActionAndCredentialNeverPrintTheSecret(t *testing.T) {
	cred := &plugins.Credential{Kind: plugins.CredentialHeader, Header: "X-Api-Key", Secret: secret}
	action := plugins.HTTPAction{ExecutionID: "ex_1", Method: "POST", URL: "https://api.example/v1", Credential: cred,
		Header: map[string][]string{"X-Trace": {"t"}}}
	var logged bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logged, nil))
	logger.Info("action", "action", action, "cred", cred)
	logger.Info("action", "action", &action)

	renders := map[string]string{"slog": logged.String()}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		renders["action "+verb] = fmt.Sprintf(verb, action)
		renders["*action "+verb] = fmt.Sprintf(verb, &action)
		renders["credential "+verb] = fmt.Sprintf(verb, cred)
		renders["credential value "+verb] = fmt.Sprintf(verb, *cred)
	}
	for name, got := range renders {
		if strings.Contains(got, secret) || strings.Contains(got, fmt.Sprintf("%x", secret)) {
			t.Errorf("%s prints the secret: %s", name, got)
		}
	}
	if got := fmt.Sprint(action); !strings.Contains(got, "ex_1") || !strings.Contains(got, "X-Api-Key") {
		t.Errorf("String = %q; want the execution id and the credential header name", got)
	}
}
