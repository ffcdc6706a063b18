package hostproto

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

const testID = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW"

// scriptedServer answers each request line it reads with the next group of reply lines and
// records the requests. The hostagent's tests run the client against the real server; this
// one exercises what a real server never sends.
func scriptedServer(t *testing.T, replies ...[]string) (*ControlClient, *[]string) {
	t.Helper()
	srv, cli := net.Pipe()
	var got []string
	var wg sync.WaitGroup
	wg.Go(func() {
		defer srv.Close()
		br := bufio.NewReader(srv)
		for _, lines := range replies {
			req, err := br.ReadString('\n')
			if err != nil {
				return
			}
			got = append(got, strings.TrimSpace(req))
			for _, l := range lines {
				if _, err := io.WriteString(srv, l+"\n"); err != nil {
					return
				}
			}
		}
		io.Copy(io.Discard, br) // until the client closes
	})
	c := NewControlClient(cli)
	t.Cleanup(func() {
		c.Close()
		wg.Wait()
	})
	return c, &got
}

func TestControlErrorUnwrap(t *testing.T) {
	tests := []struct {
		code string
		want error
	}{
		{code: CodeNotFound, want: ErrNotFound},
		{code: CodeNotRunning, want: ErrNotRunning},
		{code: CodeForbidden, want: ErrForbidden},
		{code: CodeBadRequest, want: ErrBadControlRequest},
		{code: CodeBusy, want: ErrControlBusy},
		{code: CodeInternal, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			err := &ControlError{Code: tt.code, Message: "m"}
			if got := err.Unwrap(); got != tt.want {
				t.Errorf("Unwrap = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestControlClientReplies(t *testing.T) {
	ctx := context.Background()
	c, got := scriptedServer(t,
		[]string{`{"keepalive":true}`, `{"markers":[],"missing":["` + testID + `"]}`},
		[]string{`{"error":{"code":"not_running","message":"ended"}}`},
	)
	found, missing, err := c.Status(ctx, []string{testID})
	if err != nil || len(found) != 0 || len(missing) != 1 || missing[0] != testID {
		t.Errorf("status = %v, %v, %v; want %s missing, the keepalive skipped", found, missing, err, testID)
	}
	if _, err := c.Cancel(ctx, testID); !errors.Is(err, ErrNotRunning) {
		t.Errorf("cancel = %v; want ErrNotRunning", err)
	}
	want := []string{`{"op":"status","ids":["` + testID + `"]}`, `{"op":"cancel","id":"` + testID + `"}`}
	if strings.Join(*got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests = %q; want %q", *got, want)
	}
}

func TestControlClientStatusReport(t *testing.T) {
	tests := []struct {
		name          string
		reply         string
		wantRetention time.Duration
		wantErr       error
	}{
		{name: "reported", reply: `{"markers":[],"missing":["` + testID + `"],"marker_retention_s":3600}`, wantRetention: time.Hour},
		{name: "not reported", reply: `{"markers":[],"missing":["` + testID + `"]}`, wantRetention: 0},
		{name: "negative", reply: `{"markers":[],"missing":[],"marker_retention_s":-1}`, wantErr: ErrControlProtocol},
		{name: "huge is bounded", reply: `{"markers":[],"missing":[],"marker_retention_s":9223372036854775807}`, wantRetention: maxRetentionS * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := scriptedServer(t, []string{tt.reply})
			got, err := c.StatusReport(context.Background(), []string{testID})
			if !errors.Is(err, tt.wantErr) || got.MarkerRetention != tt.wantRetention {
				t.Errorf("StatusReport = %+v, %v; want retention %v, err %v", got, err, tt.wantRetention, tt.wantErr)
			}
		})
	}
}

func TestControlClientRefusesBadRequestsBeforeSending(t *testing.T) {
	c, got := scriptedServer(t, []string{`{"marker":null}`})
	if _, _, err := c.Status(context.Background(), []string{"ex_bad"}); !errors.Is(err, ErrBadControlRequest) {
		t.Errorf("status of a bad id = %v; want ErrBadControlRequest", err)
	}
	if _, err := c.Checkpoint(context.Background(), testID, "two\nlines"); !errors.Is(err, ErrBadControlRequest) {
		t.Errorf("checkpoint with a newline = %v; want ErrBadControlRequest", err)
	}
	c.Close()
	if len(*got) != 0 {
		t.Errorf("the server got %q; want nothing", *got)
	}
}

func TestControlClientProtocolViolations(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// reply is what the server sends to the request call makes.
		reply []string
		call  func(c *ControlClient) error
	}{
		{name: "not JSON", reply: []string{`markers`}, call: func(c *ControlClient) error {
			_, _, err := c.Status(ctx, []string{testID})
			return err
		}},
		{name: "attach chunk out of order", reply: []string{`{"stream":"stdout","offset":5,"data":"eA=="}`}, call: func(c *ControlClient) error {
			_, err := c.Attach(ctx, testID, 0, 0, func(string, int64, []byte) error { return nil })
			return err
		}},
		{name: "attach unknown stream", reply: []string{`{"stream":"stdin","offset":0,"data":"eA=="}`}, call: func(c *ControlClient) error {
			_, err := c.Attach(ctx, testID, 0, 0, func(string, int64, []byte) error { return nil })
			return err
		}},
		{name: "cancel without a marker", reply: []string{`{"next":"ab"}`}, call: func(c *ControlClient) error {
			_, err := c.Cancel(ctx, testID)
			return err
		}},
		{name: "export digest mismatch", reply: []string{`{"export":"eA=="}`, `{"export_end":{"bytes":1,"sha256":"00"}}`}, call: func(c *ControlClient) error {
			_, err := c.Export(ctx, io.Discard)
			return err
		}},
		{name: "export stray line", reply: []string{`{"markers":[]}`}, call: func(c *ControlClient) error {
			_, err := c.Export(ctx, io.Discard)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := scriptedServer(t, tt.reply)
			if err := tt.call(c); !errors.Is(err, ErrControlProtocol) {
				t.Fatalf("err = %v; want ErrControlProtocol", err)
			}
			// The stream is out of step with the requests: the client stays closed.
			if _, _, err := c.Status(ctx, []string{testID}); !errors.Is(err, ErrControlProtocol) {
				t.Errorf("next call = %v; want the first violation again", err)
			}
		})
	}
}

func TestReadControlLine(t *testing.T) {
	// Past bufio's minimum buffer of 16 bytes, so that long lines take the ErrBufferFull path.
	const max = 20
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr error
	}{
		{name: "lines", in: "ab\n\ncd\n", want: []string{"ab", "", "cd"}, wantErr: io.EOF},
		{name: "last line without newline", in: "ab\ncd", want: []string{"ab", "cd"}, wantErr: io.EOF},
		{name: "at the limit", in: strings.Repeat("x", max) + "\nab\n", want: []string{strings.Repeat("x", max), "ab"}, wantErr: io.EOF},
		{name: "at the limit without newline", in: strings.Repeat("x", max), want: []string{strings.Repeat("x", max)}, wantErr: io.EOF},
		{name: "over the limit", in: strings.Repeat("x", max+1) + "\n", wantErr: ErrLineTooLong},
		{name: "over the limit without newline", in: strings.Repeat("x", max+1), wantErr: ErrLineTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tt.in), 16)
			var got []string
			var err error
			for {
				var line []byte
				if line, err = ReadControlLine(br, max); err != nil {
					break
				}
				got = append(got, string(line))
			}
			if !errors.Is(err, tt.wantErr) || strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("got = %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
