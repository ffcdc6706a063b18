package markers

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/postern-dev/postern/internal/durable"
)

// LoadOrCreateAuditKey returns the note signer stored at path, generating an Ed25519 key named
// name on first use (file mode 0600). The verifier key — what `verify` needs offline — is
// written beside it as path+".pub" and returned.
func LoadOrCreateAuditKey(path, name string) (note.Signer, string, error) {
	skey, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		s, v, err := note.GenerateKey(rand.Reader, name)
		if err != nil {
			return nil, "", fmt.Errorf("markers: generate audit key: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, "", fmt.Errorf("markers: audit key dir: %w", err)
		}
		if err := durable.CreateFile(path, []byte(s+"\n"), 0o600); err != nil {
			return nil, "", fmt.Errorf("markers: write audit key: %w", err)
		}
		if err := durable.CreateFile(path+".pub", []byte(v+"\n"), 0o600); err != nil {
			return nil, "", fmt.Errorf("markers: write audit verifier key: %w", err)
		}
		skey = []byte(s)
	} else if err != nil {
		return nil, "", fmt.Errorf("markers: read audit key: %w", err)
	}
	signer, err := note.NewSigner(strings.TrimSpace(string(skey)))
	if err != nil {
		return nil, "", fmt.Errorf("markers: audit key %s: %w", path, err)
	}
	vkey, err := os.ReadFile(path + ".pub")
	if err != nil {
		return nil, "", fmt.Errorf("markers: read audit verifier key: %w", err)
	}
	return signer, strings.TrimSpace(string(vkey)), nil
}

// checkpointBody is the signed text: the tlog checkpoint layout (origin, size, base64 head
// hash) plus the signing time as an extension line.
// ReadAuditVerifier reads the verifier key of the audit key at path (its path.pub) without
// creating anything.
func ReadAuditVerifier(path string) (string, error) {
	vkey, err := os.ReadFile(path + ".pub")
	if err != nil {
		return "", fmt.Errorf("markers: read audit verifier key: %w", err)
	}
	return strings.TrimSpace(string(vkey)), nil
}

func checkpointBody(origin string, seq uint64, headHex string, at time.Time) (string, error) {
	head, err := hex.DecodeString(headHex)
	if err != nil {
		return "", fmt.Errorf("head hash: %w", err)
	}
	return fmt.Sprintf("%s\n%d\n%s\n%s\n", origin, seq, base64.StdEncoding.EncodeToString(head),
		at.UTC().Format(time.RFC3339Nano)), nil
}

func signCheckpoint(signer note.Signer, origin string, seq uint64, headHex string, at time.Time) ([]byte, error) {
	body, err := checkpointBody(origin, seq, headHex, at)
	if err != nil {
		return nil, err
	}
	return note.Sign(&note.Note{Text: body}, signer)
}

// sealedCheckpoint is a checkpoint whose signature verified.
type sealedCheckpoint struct {
	Origin string
	Seq    uint64
	Head   string
	At     time.Time
}

// openCheckpoint verifies a signed checkpoint against the verifier key and parses it.
func openCheckpoint(signed []byte, verifiers note.Verifiers) (sealedCheckpoint, error) {
	n, err := note.Open(signed, verifiers)
	if err != nil {
		var unknown *note.UnverifiedNoteError
		if errors.As(err, &unknown) {
			return sealedCheckpoint{}, errors.New("checkpoint is not signed by the audit key")
		}
		return sealedCheckpoint{}, fmt.Errorf("checkpoint signature: %w", err)
	}
	lines := strings.Split(strings.TrimSuffix(n.Text, "\n"), "\n")
	if len(lines) != 4 {
		return sealedCheckpoint{}, fmt.Errorf("checkpoint has %d lines, want 4", len(lines))
	}
	return parseCheckpointLines(lines)
}

func parseCheckpointLines(lines []string) (sealedCheckpoint, error) {
	seq, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil {
		return sealedCheckpoint{}, fmt.Errorf("checkpoint size: %w", err)
	}
	head, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(head) != 32 {
		return sealedCheckpoint{}, fmt.Errorf("checkpoint head hash %q is not a base64 SHA-256", lines[2])
	}
	at, err := time.Parse(time.RFC3339Nano, lines[3])
	if err != nil {
		return sealedCheckpoint{}, fmt.Errorf("checkpoint time: %w", err)
	}
	return sealedCheckpoint{Origin: lines[0], Seq: seq, Head: hex.EncodeToString(head), At: at}, nil
}

// checkpointLine is how a checkpoint appears in an export.
type checkpointLine struct {
	Type string `json:"type"` // "checkpoint"
	Note string `json:"note"`
}

// baseLine opens an export whose earlier events were removed by retention: the chain resumes
// after Seq, whose hash is Hash, attested by the checkpoint that follows it.
type baseLine struct {
	Type string `json:"type"` // "base"
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// parseOwnCheckpoint reads a checkpoint this store signed, without checking the signature.
func parseOwnCheckpoint(signed []byte) (sealedCheckpoint, error) {
	text, _, ok := strings.Cut(string(signed), "\n\n")
	if !ok {
		return sealedCheckpoint{}, fmt.Errorf("%w: checkpoint without signature block", ErrCorrupt)
	}
	lines := strings.Split(text, "\n")
	if len(lines) != 4 {
		return sealedCheckpoint{}, fmt.Errorf("%w: checkpoint has %d lines", ErrCorrupt, len(lines))
	}
	return parseCheckpointLines(lines)
}
