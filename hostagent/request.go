package hostagent

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/envpolicy"
)

const (
	maxOperationKeyLen = hostproto.MaxOperationKeyLen
	maxTimeout         = 31 * 24 * time.Hour
)

// Refusal reasons a client can branch on via errors.Is; the text goes to the client's stderr.
var (
	ErrMissingExecutionID = errors.New("POSTERN_EXECUTION_ID is required (ssh -o SetEnv=POSTERN_EXECUTION_ID=ex_…)")
	ErrInvalidExecutionID = errors.New("invalid POSTERN_EXECUTION_ID: want ex_ followed by a 26-character upper-case ULID")
	ErrInvalidRequest     = errors.New("invalid request")
)

// envFilter applies the allowlist (internal/envpolicy: the builtin variables and accept_env)
// and the size limits to a session's env requests.
type envFilter struct {
	allow       envpolicy.Allowlist
	maxVars     int
	maxValueLen int
}

// newEnvFilter returns the filter of a validated cfg (Validate checked accept_env).
func newEnvFilter(cfg Config) envFilter {
	allow, err := envpolicy.New(cfg.AcceptEnv)
	if err != nil {
		// Unreachable after Validate; refusing every extra variable is the safe reading.
		allow, _ = envpolicy.New(nil)
	}
	return envFilter{allow: allow, maxVars: cfg.MaxEnvVars, maxValueLen: cfg.MaxEnvValueBytes}
}

// sessionEnv collects a session's environment as env requests arrive. It keeps only
// allowlisted variables and remembers the first limit violation, which refuses the command.
type sessionEnv struct {
	filter   envFilter
	requests int
	vars     map[string]string
	problem  error // first limit violation, reported when the command is refused
}

// add handles one env request and reports whether the variable was accepted.
func (e *sessionEnv) add(name, value string) (accepted bool) {
	e.requests++
	switch {
	case e.problem != nil:
		return false
	case e.requests > e.filter.maxVars:
		e.problem = fmt.Errorf("%w: more than %d environment variables", ErrInvalidRequest, e.filter.maxVars)
	case !envpolicy.ValidName(name):
		e.problem = fmt.Errorf("%w: invalid environment variable name", ErrInvalidRequest)
	case len(value) > e.filter.maxValueLen:
		e.problem = fmt.Errorf("%w: environment variable %s is longer than %d bytes", ErrInvalidRequest, name, e.filter.maxValueLen)
	case strings.IndexByte(value, 0) >= 0:
		e.problem = fmt.Errorf("%w: environment variable %s contains a NUL byte", ErrInvalidRequest, name)
	case !e.filter.allow.Allows(name):
		return false
	default:
		if e.vars == nil {
			e.vars = map[string]string{}
		}
		e.vars[name] = value // a repeated name replaces the earlier value, as setenv does
		return true
	}
	return false
}

// environ returns the accepted variables as sorted KEY=VALUE strings.
func (e *sessionEnv) environ() []string {
	env := make([]string, 0, len(e.vars))
	for k, v := range e.vars {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// parseOperationKey validates POSTERN_OPERATION_KEY: visible ASCII, at most 256 bytes.
func parseOperationKey(key string) (string, error) {
	if len(key) > maxOperationKeyLen {
		return "", fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalidRequest, hostproto.EnvOperationKey, maxOperationKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", fmt.Errorf("%w: %s may only contain visible ASCII characters", ErrInvalidRequest, hostproto.EnvOperationKey)
		}
	}
	return key, nil
}

// parseCwd validates POSTERN_CWD by hostproto.CheckCwd (the bastion's rule too); "" means
// home.
func parseCwd(s, home string) (string, error) {
	if s == "" {
		return home, nil
	}
	if err := hostproto.CheckCwd(s); err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrInvalidRequest, hostproto.EnvCwd, err)
	}
	return s, nil
}

// parseTimeout validates POSTERN_TIMEOUT_S: a positive number of seconds up to 31 days;
// "" means no timeout.
func parseTimeout(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 || time.Duration(n)*time.Second > maxTimeout {
		return 0, fmt.Errorf("%w: %s must be a whole number of seconds in 1..%d", ErrInvalidRequest, hostproto.EnvTimeout, int(maxTimeout.Seconds()))
	}
	return time.Duration(n) * time.Second, nil
}
