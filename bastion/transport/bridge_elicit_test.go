package transport

import (
	"encoding/json"
	"testing"
)

func TestLearnElicitation(t *testing.T) {
	for params, want := range map[string]bool{
		`{"capabilities":{}}`:                                   false,
		`{"capabilities":{"elicitation":{}}}`:                   true, // before modes: form
		`{"capabilities":{"elicitation":{"form":{}}}}`:          true,
		`{"capabilities":{"elicitation":{"url":{}}}}`:           false,
		`{"capabilities":{"elicitation":{"form":{},"url":{}}}}`: true,
		`not json`: false,
	} {
		b := &bridge{}
		b.learnElicitation(json.RawMessage(params))
		if b.elicitation != want {
			t.Errorf("learnElicitation(%s) = %v, want %v", params, b.elicitation, want)
		}
	}
}

func TestTakeOffer(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":3,"result":{"content":[],"_meta":{"dev.postern/approval-offer":{"execution_id":"ex_1","message":"m"},"other":1}}}`
	offer, out, ok := takeOffer([]byte(msg))
	if !ok || offer.ExecutionID != "ex_1" || offer.Message != "m" {
		t.Fatalf("takeOffer = %+v, %v", offer, ok)
	}
	var got struct {
		Result struct {
			Meta map[string]any `json:"_meta"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &got); err != nil || got.Result.Meta[MetaApprovalOffer] != nil || got.Result.Meta["other"] == nil {
		t.Fatalf("the relayed result %s still has the offer, or lost other _meta (%v)", out, err)
	}
	for _, plain := range []string{`{"jsonrpc":"2.0","id":3,"result":{"content":[]}}`, `{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"x"}}`, `[]`} {
		if _, _, ok := takeOffer([]byte(plain)); ok {
			t.Errorf("takeOffer(%s) found an offer", plain)
		}
	}
}
