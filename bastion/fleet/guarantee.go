package fleet

import (
	"errors"
	"fmt"
	"regexp"
)

// Guarantee is what a host can promise about an execution whose outcome the bastion lost
// (docs/agentless.md): the hostagent's durable marker, the marker
// script's, or nothing.
type Guarantee string

const (
	// GuaranteeHostagent: the hostagent keeps a durable marker and the output; an unknown
	// outcome is resolved by asking it, output re-attached, a restart of it survived.
	GuaranteeHostagent Guarantee = "hostagent"
	// GuaranteeMarkerScript: stock sshd with the ~/.postern/run wrapper: a durable marker
	// and exit status, no output kept, no re-attach.
	GuaranteeMarkerScript Guarantee = "marker_script"
	// GuaranteeNone: stock sshd and nothing installed: an outcome lost after the command
	// was sent is unknown for good, review required, never sent again.
	GuaranteeNone Guarantee = "none"
)

// Level is the host's guarantee; hosts enrolled before levels existed run the hostagent.
func (h Host) Level() Guarantee {
	if h.Guarantee == "" {
		return GuaranteeHostagent
	}
	return h.Guarantee
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// checkGuarantee validates an inventory entry's guarantee and script digest.
func checkGuarantee(g Guarantee, digest string) error {
	switch g {
	case "", GuaranteeHostagent, GuaranteeNone:
		if digest != "" {
			return fmt.Errorf("marker_script_sha256 is only for guarantee = %q", GuaranteeMarkerScript)
		}
	case GuaranteeMarkerScript:
		if !sha256Hex.MatchString(digest) {
			return errors.New("guarantee marker_script needs marker_script_sha256 (64 hex digits), recorded by `postern hosts enroll --marker-script`")
		}
	default:
		return fmt.Errorf("guarantee %q: want %s, %s or %s", g, GuaranteeHostagent, GuaranteeMarkerScript, GuaranteeNone)
	}
	return nil
}
