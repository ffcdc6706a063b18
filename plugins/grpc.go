package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// The wire format is JSON over gRPC with hand-written service descriptors: the contract is a few
// plain Go structs, the machine has no protoc toolchain, and generated stubs would be a second
// definition of the same types to keep in sync. go-plugin's own services (broker, controller,
// stdio) keep their protobuf codec; only our calls select this one by content subtype.

// jsonCodecName is the gRPC content subtype of every call in this package.
const jsonCodecName = "json"

func init() { encoding.RegisterCodec(jsonCodec{}) }

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Name() string                       { return jsonCodecName }

// maxMessageBytes bounds one gRPC message either way: an action or an outcome carries a body
// capped by the bastion (request) or MaxResponseBytes (response), far below this.
const maxMessageBytes = 64 << 20

// NewGRPCServer is the plugin binary's go-plugin ServeConfig.GRPCServer: go-plugin's default
// server with the message limit raised from gRPC's 4 MiB to maxMessageBytes, so an action with
// a large request body is accepted.
func NewGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	return plugin.DefaultGRPCServer(append(opts, grpc.MaxRecvMsgSize(maxMessageBytes), grpc.MaxSendMsgSize(maxMessageBytes)))
}

var callOptions = []grpc.CallOption{
	grpc.CallContentSubtype(jsonCodecName),
	grpc.MaxCallRecvMsgSize(maxMessageBytes),
	grpc.MaxCallSendMsgSize(maxMessageBytes),
}

// performRequest is the Channel.Perform message: the action and the broker id on which the
// host serves the Journal for this call.
type performRequest struct {
	Action          HTTPAction `json:"action"`
	JournalBrokerID uint32     `json:"journal_broker_id"`
}

// journalRequest is the message of every Journal method; unused fields stay empty.
type journalRequest struct {
	ExecutionID string        `json:"execution_id"`
	Response    *HTTPResponse `json:"response,omitempty"`
	Reason      string        `json:"reason,omitempty"`
}

type empty struct{}

const (
	channelService = "postern.plugins.Channel"
	journalService = "postern.plugins.Journal"
)

// unaryHandler adapts a typed method to grpc.MethodDesc's handler shape.
func unaryHandler[Req any, Resp any](fullMethod string, call func(srv any, ctx context.Context, req *Req) (*Resp, error)) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		req := new(Req)
		if err := dec(req); err != nil {
			return nil, err
		}
		if interceptor == nil {
			return call(srv, ctx, req)
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod}
		return interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			return call(srv, ctx, req.(*Req))
		})
	}
}

// channelServiceDesc serves a Channel in the plugin process.
var channelServiceDesc = grpc.ServiceDesc{
	ServiceName: channelService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Perform",
		Handler: unaryHandler("/"+channelService+"/Perform", func(srv any, ctx context.Context, req *performRequest) (*Outcome, error) {
			return srv.(*channelServer).perform(ctx, req)
		}),
	}},
}

func journalMethod(name string, call func(j Journal, ctx context.Context, req *journalRequest) error) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: unaryHandler("/"+journalService+"/"+name, func(srv any, ctx context.Context, req *journalRequest) (*empty, error) {
			if err := call(srv.(Journal), ctx, req); err != nil {
				return nil, status.Error(codes.Aborted, err.Error())
			}
			return &empty{}, nil
		}),
	}
}

// journalServiceDesc serves the bastion's Journal on the broker, in the host process.
var journalServiceDesc = grpc.ServiceDesc{
	ServiceName: journalService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		journalMethod("Dispatched", func(j Journal, ctx context.Context, req *journalRequest) error {
			return j.Dispatched(ctx, req.ExecutionID)
		}),
		journalMethod("Completed", func(j Journal, ctx context.Context, req *journalRequest) error {
			if req.Response == nil {
				return errors.New("completed without a response")
			}
			return j.Completed(ctx, req.ExecutionID, *req.Response)
		}),
		journalMethod("Failed", func(j Journal, ctx context.Context, req *journalRequest) error {
			return j.Failed(ctx, req.ExecutionID, req.Reason)
		}),
		journalMethod("Unknown", func(j Journal, ctx context.Context, req *journalRequest) error {
			return j.Unknown(ctx, req.ExecutionID, req.Reason)
		}),
	},
}

// ChannelPlugin is the go-plugin glue for a Channel. The plugin binary sets Impl; the host
// leaves it nil and dispenses a client.
type ChannelPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Channel
}

var _ plugin.GRPCPlugin = (*ChannelPlugin)(nil)

// GRPCServer registers the Channel service (plugin side).
func (p *ChannelPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("plugins: ChannelPlugin has no implementation to serve")
	}
	s.RegisterService(&channelServiceDesc, &channelServer{impl: p.Impl, broker: broker})
	return nil
}

// GRPCClient returns the host-side Channel (a *channelClient).
func (p *ChannelPlugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return &channelClient{conn: conn, broker: broker}, nil
}

// channelServer runs in the plugin: it performs each call, reporting to the host's Journal
// over one connection per broker id, dialed on first use and kept (a TLS handshake per call
// would cost more than the request).
type channelServer struct {
	impl   Channel
	broker *plugin.GRPCBroker

	mu    sync.Mutex // guards conns
	conns map[uint32]*grpc.ClientConn
}

func (s *channelServer) journalConn(id uint32) (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.conns[id]; c != nil {
		return c, nil
	}
	c, err := s.broker.Dial(id)
	if err != nil {
		return nil, err
	}
	if s.conns == nil {
		s.conns = map[uint32]*grpc.ClientConn{}
	}
	s.conns[id] = c
	return c, nil
}

func (s *channelServer) perform(ctx context.Context, req *performRequest) (*Outcome, error) {
	conn, err := s.journalConn(req.JournalBrokerID)
	if err != nil {
		// Nothing was sent and nothing could be journaled: the host sees the error and its
		// journal has no dispatched point, so it records failed.
		return nil, status.Errorf(codes.Aborted, "dial the journal on broker id %d: %v", req.JournalBrokerID, err)
	}
	out, err := s.impl.Perform(ctx, req.Action, &journalClient{conn: conn})
	if err != nil {
		return nil, status.Error(codes.Aborted, err.Error())
	}
	return &out, nil
}

// journalClient is the plugin's view of the host's Journal.
type journalClient struct{ conn *grpc.ClientConn }

var _ Journal = (*journalClient)(nil)

func (j *journalClient) call(ctx context.Context, method string, req *journalRequest) error {
	if err := j.conn.Invoke(ctx, "/"+journalService+"/"+method, req, &empty{}, callOptions...); err != nil {
		return fmt.Errorf("journal %s for %s: %w", method, req.ExecutionID, err)
	}
	return nil
}

func (j *journalClient) Dispatched(ctx context.Context, executionID string) error {
	return j.call(ctx, "Dispatched", &journalRequest{ExecutionID: executionID})
}

func (j *journalClient) Completed(ctx context.Context, executionID string, resp HTTPResponse) error {
	return j.call(ctx, "Completed", &journalRequest{ExecutionID: executionID, Response: &resp})
}

func (j *journalClient) Failed(ctx context.Context, executionID, reason string) error {
	return j.call(ctx, "Failed", &journalRequest{ExecutionID: executionID, Reason: reason})
}

func (j *journalClient) Unknown(ctx context.Context, executionID, reason string) error {
	return j.call(ctx, "Unknown", &journalRequest{ExecutionID: executionID, Reason: reason})
}

// channelClient is the host's view of the plugin's Channel. It serves one Journal service on
// one broker id for the plugin's lifetime, routing each report to the Perform call in flight
// for that execution id.
type channelClient struct {
	conn   *grpc.ClientConn
	broker *plugin.GRPCBroker

	once      sync.Once
	journalID uint32
	router    *journalRouter
	server    chan *grpc.Server // the journal server, once built
	served    chan struct{}     // closed when the journal server stopped
}

var _ Channel = (*channelClient)(nil)

// errPerformRejected marks an error the plugin returned from Perform (a journal call failed, the
// action was invalid), as opposed to a broken connection.
var errPerformRejected = errors.New("plugin rejected the action")

// serveJournal starts the journal server on first use.
func (c *channelClient) serveJournal() {
	c.once.Do(func() {
		c.router = &journalRouter{calls: map[string]*callJournal{}}
		c.journalID = c.broker.NextId()
		c.server = make(chan *grpc.Server, 1)
		c.served = make(chan struct{})
		go func() {
			defer close(c.served)
			c.broker.AcceptAndServe(c.journalID, func(opts []grpc.ServerOption) *grpc.Server {
				opts = append(opts, grpc.MaxRecvMsgSize(maxMessageBytes), grpc.MaxSendMsgSize(maxMessageBytes))
				s := grpc.NewServer(opts...)
				s.RegisterService(&journalServiceDesc, c.router)
				c.server <- s
				return s
			})
		}()
	})
}

// close stops the journal server and waits for it (the plugin is being discarded).
func (c *channelClient) close() {
	if c.served == nil {
		return
	}
	select {
	case s := <-c.server:
		s.Stop()
		<-c.served
	case <-c.served:
	}
}

// Perform serves journal to the plugin for the duration of the call. When it returns, no journal
// method is running or will run for this call, so what the journal holds then is final for the
// caller to judge.
func (c *channelClient) Perform(ctx context.Context, action HTTPAction, journal Journal) (Outcome, error) {
	c.serveJournal()
	gated := &callJournal{journal: journal}
	if err := c.router.add(action.ExecutionID, gated); err != nil {
		return Outcome{}, err
	}
	defer c.router.remove(action.ExecutionID, gated)

	var out Outcome
	err := c.conn.Invoke(ctx, "/"+channelService+"/Perform",
		&performRequest{Action: action, JournalBrokerID: c.journalID}, &out, callOptions...)
	if err == nil {
		return out, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return Outcome{}, fmt.Errorf("plugins: perform %s: %w", action.ExecutionID, ctxErr)
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Aborted {
		return Outcome{}, fmt.Errorf("plugins: perform %s: %w: %s", action.ExecutionID, errPerformRejected, st.Message())
	}
	return Outcome{}, fmt.Errorf("plugins: perform %s: %w: %w", action.ExecutionID, ErrPluginCrashed, err)
}

// journalRouter is the Journal the plugin reaches: it hands each report to the call in
// flight for its execution id, and refuses reports for any other.
type journalRouter struct {
	mu    sync.Mutex // guards calls; released before a call's own lock (callJournal.mu) is taken
	calls map[string]*callJournal
}

var _ Journal = (*journalRouter)(nil)

func (r *journalRouter) add(id string, g *callJournal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls[id] != nil {
		return fmt.Errorf("plugins: %s is already being performed", id)
	}
	r.calls[id] = g
	return nil
}

// remove ends the call: later reports are refused and reports in flight are waited for.
func (r *journalRouter) remove(id string, g *callJournal) {
	r.mu.Lock()
	if r.calls[id] == g {
		delete(r.calls, id)
	}
	r.mu.Unlock()
	g.close()
}

func (r *journalRouter) call(id string) (*callJournal, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g := r.calls[id]; g != nil {
		return g, nil
	}
	return nil, fmt.Errorf("%w: no call in flight for %s", errCallEnded, id)
}

func (r *journalRouter) Dispatched(ctx context.Context, id string) error {
	g, err := r.call(id)
	if err != nil {
		return err
	}
	return g.Dispatched(ctx, id)
}

func (r *journalRouter) Completed(ctx context.Context, id string, resp HTTPResponse) error {
	g, err := r.call(id)
	if err != nil {
		return err
	}
	return g.Completed(ctx, id, resp)
}

func (r *journalRouter) Failed(ctx context.Context, id, reason string) error {
	g, err := r.call(id)
	if err != nil {
		return err
	}
	return g.Failed(ctx, id, reason)
}

func (r *journalRouter) Unknown(ctx context.Context, id, reason string) error {
	g, err := r.call(id)
	if err != nil {
		return err
	}
	return g.Unknown(ctx, id, reason)
}

var errCallEnded = errors.New("the Perform call this journal served has returned")

// callJournal is one Perform call's Journal: it refuses calls once the call has returned, and
// close waits for calls in flight.
type callJournal struct {
	journal Journal

	// mu is held for reading across each journal call and for writing by close.
	mu     sync.RWMutex
	closed bool
}

var _ Journal = (*callJournal)(nil)

func (g *callJournal) enter() error {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return errCallEnded
	}
	return nil
}

func (g *callJournal) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
}

func (g *callJournal) Dispatched(ctx context.Context, executionID string) error {
	if err := g.enter(); err != nil {
		return err
	}
	defer g.mu.RUnlock()
	return g.journal.Dispatched(ctx, executionID)
}

func (g *callJournal) Completed(ctx context.Context, executionID string, resp HTTPResponse) error {
	if err := g.enter(); err != nil {
		return err
	}
	defer g.mu.RUnlock()
	return g.journal.Completed(ctx, executionID, resp)
}

func (g *callJournal) Failed(ctx context.Context, executionID, reason string) error {
	if err := g.enter(); err != nil {
		return err
	}
	defer g.mu.RUnlock()
	return g.journal.Failed(ctx, executionID, reason)
}

func (g *callJournal) Unknown(ctx context.Context, executionID, reason string) error {
	if err := g.enter(); err != nil {
		return err
	}
	defer g.mu.RUnlock()
	return g.journal.Unknown(ctx, executionID, reason)
}
