package tasks

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// HTTPHandler carries a tools/call's task augmentation past go-sdk: go-sdk's CallToolParams
// has no "task" member and would drop it, so a POSTed tools/call whose params have one gets
// it moved under params._meta, which go-sdk keeps and the middleware reads. Nothing else in
// the body changes; other messages pass untouched. The body must already be bounded (the
// transports read it whole under their limit).
func HTTPHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading request body failed", http.StatusBadRequest)
			return
		}
		if out, ok := moveTask(body); ok {
			body = out
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// moveTask rewrites one tools/call message whose params have a "task" member; ok is false
// for anything else (including batches, which task-capable protocol versions do not allow).
func moveTask(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(`"task"`)) || !bytes.Contains(body, []byte(`"tools/call"`)) {
		return nil, false
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(body, &msg) != nil {
		return nil, false
	}
	var method string
	if json.Unmarshal(msg["method"], &method) != nil || method != "tools/call" {
		return nil, false
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(msg["params"], &params) != nil {
		return nil, false
	}
	task, ok := params["task"]
	if !ok {
		return nil, false
	}
	var meta map[string]json.RawMessage
	if raw, ok := params["_meta"]; ok && json.Unmarshal(raw, &meta) != nil {
		return nil, false
	}
	if meta == nil { // absent, or null
		meta = map[string]json.RawMessage{}
	}
	meta[metaTask] = task
	delete(params, "task")
	var err error
	if params["_meta"], err = json.Marshal(meta); err != nil {
		return nil, false
	}
	if msg["params"], err = json.Marshal(params); err != nil {
		return nil, false
	}
	out, err := json.Marshal(msg)
	return out, err == nil
}
