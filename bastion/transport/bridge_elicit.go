package transport

import (
	"context"
	"encoding/json"
	"fmt"
)

// approvalOffer is what the daemon puts under MetaApprovalOffer.
type approvalOffer struct {
	ExecutionID string `json:"execution_id"`
	Message     string `json:"message"`
	// Token goes back with the decision: it shows the daemon that the decision comes from
	// the bridge it offered the approval to.
	Token string `json:"token"`
}

// ApprovalSchema is the form the client's user fills in: a decision and a note (the bridge
// and the daemon's stateful sessions ask with it).
var ApprovalSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"decision": map[string]any{
			"type": "string", "title": "Decision", "enum": []string{"approve", "deny"},
			"description": "approve runs it now; deny rejects it (a retry returns the rejection)",
		},
		"note": map[string]any{"type": "string", "title": "Note", "description": "why (journaled with the decision)", "maxLength": 1024},
	},
	"required": []string{"decision"},
}

// learnElicitation records whether the client declared the elicitation capability with form
// mode (an empty elicitation object means form, as before modes existed).
func (b *bridge) learnElicitation(params json.RawMessage) {
	var p struct {
		Capabilities struct {
			Elicitation *struct {
				Form json.RawMessage `json:"form"`
				URL  json.RawMessage `json:"url"`
			} `json:"elicitation"`
		} `json:"capabilities"`
	}
	if json.Unmarshal(params, &p) != nil {
		return
	}
	e := p.Capabilities.Elicitation
	b.mu.Lock()
	b.elicitation = e != nil && (e.Form != nil || e.URL == nil)
	b.mu.Unlock()
}

// takeOffer returns the approval offer of a tools/call response and the response without it.
func takeOffer(msg []byte) (approvalOffer, []byte, bool) {
	var resp map[string]json.RawMessage
	if json.Unmarshal(msg, &resp) != nil {
		return approvalOffer{}, nil, false
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(resp["result"], &result) != nil {
		return approvalOffer{}, nil, false
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(result["_meta"], &meta) != nil {
		return approvalOffer{}, nil, false
	}
	var offer approvalOffer
	if raw, ok := meta[MetaApprovalOffer]; !ok || json.Unmarshal(raw, &offer) != nil || offer.ExecutionID == "" {
		return approvalOffer{}, nil, false
	}
	delete(meta, MetaApprovalOffer)
	var err error
	if len(meta) == 0 {
		delete(result, "_meta")
	} else if result["_meta"], err = json.Marshal(meta); err != nil {
		return approvalOffer{}, nil, false
	}
	if resp["result"], err = json.Marshal(result); err != nil {
		return approvalOffer{}, nil, false
	}
	out, err := json.Marshal(resp)
	return offer, out, err == nil
}

// answerAsked hands a client's response to the bridge's own request waiting for it; false if
// env answers nothing the bridge asked (it is forwarded to the daemon as before).
func (b *bridge) answerAsked(env *envelope) bool {
	id := idKey(env.ID)
	b.mu.Lock()
	ch, ok := b.asked[id]
	delete(b.asked, id)
	b.mu.Unlock()
	if ok {
		ch <- *env
	}
	return ok
}

// askApproval asks the client's user about offer (elicitation/create, a form) and sends the
// answer to the daemon. It reports whether the user decided: then the execution's state may
// have changed — by this decision, or by an operator's that came first — and the call is to
// be sent again for it. ctx is the call's: if the client gives up on the call, the question
// is withdrawn (notifications/cancelled).
func (b *bridge) askApproval(ctx context.Context, offer approvalOffer) bool {
	b.mu.Lock()
	b.askedSeq++
	id, err := json.Marshal(fmt.Sprintf("postern-approval-%d", b.askedSeq))
	ch := make(chan envelope, 1)
	if err == nil {
		b.asked[idKey(id)] = ch
	}
	b.mu.Unlock()
	if err != nil {
		return false
	}
	forget := func() {
		b.mu.Lock()
		delete(b.asked, idKey(id))
		b.mu.Unlock()
	}
	req, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": json.RawMessage(id), "method": "elicitation/create",
		"params": map[string]any{"message": offer.Message, "requestedSchema": ApprovalSchema},
	})
	if err != nil {
		forget()
		return false
	}
	b.write(req)
	var got envelope
	select {
	case got = <-ch:
	case <-ctx.Done():
		forget()
		if cancel, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled",
			"params": map[string]any{"requestId": json.RawMessage(id), "reason": "the tool call was abandoned"}}); err == nil {
			b.write(cancel)
		}
		return false
	}
	var answer struct {
		Action  string `json:"action"`
		Content struct {
			Decision string `json:"decision"`
			Note     string `json:"note"`
		} `json:"content"`
	}
	if got.Error != nil || json.Unmarshal(got.Result, &answer) != nil || answer.Action != "accept" ||
		(answer.Content.Decision != "approve" && answer.Content.Decision != "deny") {
		return false // declined, dismissed or malformed: the execution waits for an operator
	}
	// A decision the daemon refuses (an operator decided first, the approval timed out) is
	// not an error to the client: sending the call again shows what holds.
	b.sendDecision(ctx, offer, answer.Content.Decision, answer.Content.Note)
	return true
}

// sendDecision sends the user's decision on offer to the daemon (MethodApproval). Its answer
// is not needed: the call sent again afterwards shows what holds.
func (b *bridge) sendDecision(ctx context.Context, offer approvalOffer, decision, note string) {
	b.mu.Lock()
	b.askedSeq++
	id, _ := json.Marshal(fmt.Sprintf("postern-decision-%d", b.askedSeq))
	b.mu.Unlock()
	line, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": json.RawMessage(id), "method": MethodApproval,
		"params": map[string]any{"execution_id": offer.ExecutionID, "decision": decision, "note": note, "token": offer.Token},
	})
	if err != nil {
		return
	}
	_ = b.roundTrip(ctx, &envelope{ID: id, Method: MethodApproval}, line, func([]byte) {})
}
