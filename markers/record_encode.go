package markers

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"
)

// appendRecord appends the JSON of r, byte for byte what json.Marshal makes of it (the
// storage form and every event's record are hashed into the chain: the bytes are the
// format), without reflection. Every record write encodes the record once per step, and
// json.Marshal's reflective walk of its forty-odd fields was the journal's largest CPU item
// after the fsync. Fields that are rare or nested (request, fleet, checkpoints, a time
// outside UTC or years 0–9999) go through json.Marshal in place; FuzzEncodeRecord checks
// the whole against json.Marshal.
//
// A field added to Record must be added here, in its declaration order:
// TestEncodeRecordCoversEveryField fails until it is.
func appendRecord(b []byte, r *Record) ([]byte, error) {
	var err error
	b = append(b, `{"id":`...)
	b = appendJSONString(b, r.ID)
	b = append(b, `,"graph":`...)
	b = appendJSONString(b, string(r.Graph))
	b = append(b, `,"state":`...)
	b = appendJSONString(b, string(r.State))
	b = appendOptString(b, `,"actor":`, r.Actor)
	b = appendOptString(b, `,"policy_actor":`, r.PolicyActor)
	b = appendOptString(b, `,"intent_scope":`, r.IntentScope)
	b = appendOptString(b, `,"fingerprint":`, r.Fingerprint)
	b = appendOptString(b, `,"idempotency_key":`, r.IdempotencyKey)
	b = appendOptString(b, `,"principal":`, r.Principal)
	b = appendOptString(b, `,"operation_key":`, r.OperationKey)
	b = appendOptString(b, `,"previous_attempt":`, r.PreviousAttempt)
	b = appendOptString(b, `,"recovered_from":`, r.RecoveredFrom)
	b = appendOptString(b, `,"tool":`, r.Tool)
	b = appendOptString(b, `,"channel":`, r.Channel)
	b = appendOptString(b, `,"target":`, r.Target)
	b = appendOptString(b, `,"account":`, r.Account)
	b = appendOptStrings(b, `,"command":`, r.Command)
	b = appendOptString(b, `,"cwd":`, r.Cwd)
	b = appendOptString(b, `,"class":`, r.Class)
	b = appendOptString(b, `,"decision":`, r.Decision)
	b = appendOptString(b, `,"rule":`, r.Rule)
	b = appendOptString(b, `,"reason":`, r.Reason)
	b = appendOptString(b, `,"replica":`, r.Replica)
	b = appendOptString(b, `,"host":`, r.Host)
	if len(r.Request) > 0 {
		if b, err = appendMarshaled(b, `,"request":`, r.Request); err != nil {
			return nil, err
		}
	}
	if len(r.Env) > 0 {
		b = append(b, `,"env":{`...)
		for i, k := range slices.Sorted(maps.Keys(r.Env)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, r.Env[k])
		}
		b = append(b, '}')
	}
	b = appendOptInt(b, `,"timeout_s":`, int64(r.TimeoutSeconds))
	if b, err = appendTime(b, `,"created_at":`, r.CreatedAt); err != nil {
		return nil, err
	}
	if b, err = appendTime(b, `,"updated_at":`, r.UpdatedAt); err != nil {
		return nil, err
	}
	if len(r.StateTimes) > 0 {
		b = append(b, `,"state_times":{`...)
		states := make([]State, 0, 16) // more than any graph has: on the stack
		for s := range r.StateTimes {
			states = append(states, s)
		}
		slices.Sort(states)
		for i, s := range states {
			if i > 0 {
				b = append(b, ',')
			}
			// A map's string keys are written as its string values are, in sorted order.
			if b, err = appendTime(appendJSONString(b, string(s)), ":", r.StateTimes[s]); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	if r.ExitCode != nil {
		b = append(b, `,"exit_code":`...)
		b = strconv.AppendInt(b, int64(*r.ExitCode), 10)
	}
	b = appendOptString(b, `,"signal":`, r.Signal)
	b = appendOptInt(b, `,"http_status":`, int64(r.HTTPStatus))
	b = appendOptBool(b, `,"is_error":`, r.IsError)
	b = appendOptString(b, `,"result_ref":`, r.ResultRef)
	if r.Output != (Output{}) {
		o := r.Output
		b = append(b, `,"output":{`...)
		n := len(b)
		b = appendOptInt(b, `,"stdout_bytes":`, o.StdoutBytes)
		b = appendOptInt(b, `,"stderr_bytes":`, o.StderrBytes)
		b = appendOptString(b, `,"stdout_sha256":`, o.StdoutSHA256)
		b = appendOptString(b, `,"stderr_sha256":`, o.StderrSHA256)
		b = appendOptBool(b, `,"truncated":`, o.Truncated)
		b = append(b[:n], b[n+1:]...) // the first field's comma
		b = append(b, '}')
	}
	b = appendOptStrings(b, `,"evidence":`, r.Evidence)
	b = appendOptBool(b, `,"review_required":`, r.ReviewRequired)
	b = appendOptString(b, `,"start_error":`, r.StartError)
	if r.ResultDeliveredAt != nil {
		if b, err = appendTime(b, `,"result_delivered_at":`, *r.ResultDeliveredAt); err != nil {
			return nil, err
		}
	}
	b = appendOptString(b, `,"operation_taken_by":`, r.OperationTakenBy)
	b = appendOptString(b, `,"fleet_run":`, r.FleetRun)
	if r.Fleet != nil {
		if b, err = appendMarshaled(b, `,"fleet":`, r.Fleet); err != nil {
			return nil, err
		}
	}
	b = appendOptInt(b, `,"pid":`, int64(r.PID))
	if r.PIDStart != 0 {
		b = append(b, `,"pid_start":`...)
		b = strconv.AppendUint(b, r.PIDStart, 10)
	}
	b = appendOptString(b, `,"spool_dir":`, r.SpoolDir)
	b = appendOptString(b, `,"boot_id":`, r.BootID)
	if len(r.Checkpoints) > 0 {
		if b, err = appendMarshaled(b, `,"checkpoints":`, r.Checkpoints); err != nil {
			return nil, err
		}
	}
	b = appendOptBool(b, `,"validated":`, r.Validated)
	return append(b, '}'), nil
}

func appendOptString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendJSONString(append(b, key...), s)
}

func appendOptStrings(b []byte, key string, ss []string) []byte {
	if len(ss) == 0 {
		return b
	}
	b = append(b, key...)
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

func appendOptInt(b []byte, key string, n int64) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), n, 10)
}

func appendOptBool(b []byte, key string, v bool) []byte {
	if !v {
		return b
	}
	return append(append(b, key...), "true"...)
}

// appendTime appends key and t as time.Time's MarshalJSON writes it: RFC 3339 with
// nanoseconds, written here for UTC times of years 0–9999 (every time the store sets).
func appendTime(b []byte, key string, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y > 9999 || t.Location() != time.UTC {
		return appendMarshaled(b, key, t)
	}
	b = append(b, key...)
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

// appendMarshaled appends key and json.Marshal's encoding of v.
func appendMarshaled(b []byte, key string, v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(append(b, key...), j...), nil
}
