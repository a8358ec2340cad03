// Command soak runs Gazette's own client package (go.gazette.dev/core/broker/client at the
// version interop/go.mod pins) against a broker cluster — Gazette's or pygazette's — under
// concurrency for a bounded time, and prints what the client saw as one JSON document.
//
// It creates -journals journals (replication -replication) under -prefix and runs, on each:
//
//   - -appenders appenders: half loop client.Append (Gazette's Appender, one RPC a record),
//     half an AppendService each (StartAppend, Release, wait); each writes its own numbered
//     records, one at a time, and retries a record the client gave up on.
//   - -readers blocking RetryReaders from the journal's first record, at the head while
//     the appenders write. Each reader's client is dialed to a different broker (its route
//     cache starts empty, so its first Read goes there; later ones go where routes lead).
//   - -hoppers more such readers, each of which starts a new RetryReader where it is every
//     -hop-every (as consumers come and go): Read RPCs that start at the head of a journal
//     while appends are in flight. Those RPCs are not counted as retries.
//
// Every Read and Append RPC goes through a counting JournalClient: it counts RPCs started,
// each error a stream ends with (by class), and it validates each response it passes on with
// the same Validate() Gazette's client applies, counting failures (the client rejects those
// responses and retries). A stream a pygazette broker aborted INTERNAL "response failed
// validation" (PYGAZETTE_CHECK_RESPONSES=1: it refused to send such a response) counts as
// one too. A logrus hook counts the client's "(will retry)" warnings.
//
// After -duration the appenders stop; readers read on to each journal's write head. The
// records each reader read are checked against what the appenders wrote: per appender, in
// order, each exactly once — but for a record whose append was retried (its first attempt
// may have committed too), which may appear twice in a row.
//
// With -kill-pid, that process is sent SIGKILL -kill-after into the run (the harness
// restarts it); retries are reported with their time relative to the kill. With -victim (its
// endpoint), once the appenders stop and it serves again, a late reader per journal reads
// the whole journal from it: a replica that lost its content, serving Reads of it.
//
//	soak -brokers http://127.0.0.1:8080,http://127.0.0.1:8081,http://127.0.0.1:8082 \
//	    -replication 3 -duration 10s -prefix soak/steady/
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	log "github.com/sirupsen/logrus"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
	"go.gazette.dev/core/labels"
	mbp "go.gazette.dev/core/mainboilerplate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type config struct {
	brokers     []pb.Endpoint
	replication int32
	prefix      string
	journals    int
	appenders   int
	readers     int
	hoppers     int
	hopEvery    time.Duration
	recordSize  int
	duration    time.Duration
	drain       time.Duration
	killPid     int
	killAfter   time.Duration
	victim      pb.Endpoint
	fileRoot    string
}

func main() {
	var cfg config
	var brokers string
	var replication int
	flag.StringVar(&brokers, "brokers", "http://127.0.0.1:8080", "comma-separated broker endpoints")
	flag.IntVar(&replication, "replication", 3, "replication of the journals")
	flag.StringVar(&cfg.prefix, "prefix", "soak/", "journal name prefix (ends in /)")
	flag.IntVar(&cfg.journals, "journals", 4, "journals")
	flag.IntVar(&cfg.appenders, "appenders", 4, "appenders per journal")
	flag.IntVar(&cfg.readers, "readers", 3, "blocking readers per journal")
	flag.IntVar(&cfg.hoppers, "hoppers", 1,
		"more blocking readers per journal, each starting a new Read RPC every -hop-every")
	flag.DurationVar(&cfg.hopEvery, "hop-every", 200*time.Millisecond, "see -hoppers")
	flag.IntVar(&cfg.recordSize, "record-size", 128, "bytes per record (at least 32)")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long the appenders write")
	flag.DurationVar(&cfg.drain, "drain", 60*time.Second,
		"how long readers may take, after the appenders stop, to reach the write heads")
	flag.IntVar(&cfg.killPid, "kill-pid", 0, "a process to SIGKILL -kill-after into the run")
	flag.DurationVar(&cfg.killAfter, "kill-after", 3*time.Second, "when to kill -kill-pid")
	var victim string
	flag.StringVar(&victim, "victim", "",
		"the killed broker's endpoint: once the appenders stop and it serves again (restarted), "+
			"a late reader per journal reads everything from it (a client without a route cache)")
	flag.StringVar(&cfg.fileRoot, "file-root", "", "where file:// fragment stores are rooted")
	flag.Parse()
	cfg.victim = pb.Endpoint(victim)

	for _, b := range strings.Split(brokers, ",") {
		cfg.brokers = append(cfg.brokers, pb.Endpoint(strings.TrimSpace(b)))
	}
	cfg.replication = int32(replication)
	if !strings.HasSuffix(cfg.prefix, "/") {
		cfg.prefix += "/"
	}
	if cfg.recordSize < 32 || cfg.journals < 1 || cfg.appenders < 1 || cfg.readers < 1 {
		fmt.Fprintln(os.Stderr, "soak: -record-size >= 32, -journals, -appenders, -readers >= 1")
		os.Exit(2)
	}
	var out, err = run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	var enc = json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// counters is what one client (an appender or a reader) saw, kept by the counting
// JournalClient through the RPC's context.
type counters struct {
	rpcs        atomic.Int64 // Read or Append RPCs started.
	validation  atomic.Int64 // Responses failing Gazette's Validate().
	refused     atomic.Int64 // Streams a pygazette broker aborted rather than send such a response.
	mu          sync.Mutex
	errs        map[string]int64 // Stream ends other than a clean one, by class.
	validations []string         // The first few validation errors, verbatim.
}

type ctxKey struct{}

func withCounters(ctx context.Context, c *counters) context.Context {
	return context.WithValue(ctx, ctxKey{}, c)
}

func countersOf(ctx context.Context) *counters {
	var c, _ = ctx.Value(ctxKey{}).(*counters)
	return c
}

func (c *counters) error(err error) {
	var class = errClass(err)
	if class == "grpc_internal" && strings.Contains(err.Error(), "response failed validation") {
		// A pygazette broker checking its responses (PYGAZETTE_CHECK_RESPONSES=1) found one
		// that breaks Gazette's rules and aborted the stream instead of sending it.
		c.refused.Add(1)
		c.mu.Lock()
		if len(c.validations) < 5 {
			c.validations = append(c.validations, "refused by the broker: "+err.Error())
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.errs[class]++
	c.mu.Unlock()
}

func (c *counters) invalid(err error) {
	c.validation.Add(1)
	c.mu.Lock()
	if len(c.validations) < 5 {
		c.validations = append(c.validations, err.Error())
	}
	c.mu.Unlock()
}

// errClass names an error a stream ended with: a gRPC code, "eof" (the server ended the
// stream cleanly), or "other".
func errClass(err error) string {
	if err == io.EOF {
		return "eof"
	}
	if s, ok := status.FromError(err); ok {
		return "grpc_" + strings.ToLower(s.Code().String())
	}
	if errors.Is(err, context.Canceled) {
		return "grpc_" + strings.ToLower(codes.Canceled.String())
	}
	return "other"
}

// countingClient wraps a JournalClient: Read and Append streams are counted and their
// responses validated (as the client will) on the counters of their context.
type countingClient struct{ pb.JournalClient }

func (cc countingClient) Read(ctx context.Context, in *pb.ReadRequest, opts ...grpc.CallOption) (pb.Journal_ReadClient, error) {
	var c = countersOf(ctx)
	if c != nil {
		c.rpcs.Add(1)
	}
	var s, err = cc.JournalClient.Read(ctx, in, opts...)
	if err != nil {
		if c != nil {
			c.error(err)
		}
		return nil, err
	}
	if c == nil {
		return s, nil
	}
	return &countingRead{Journal_ReadClient: s, c: c}, nil
}

func (cc countingClient) Append(ctx context.Context, opts ...grpc.CallOption) (pb.Journal_AppendClient, error) {
	var c = countersOf(ctx)
	if c != nil {
		c.rpcs.Add(1)
	}
	var s, err = cc.JournalClient.Append(ctx, opts...)
	if err != nil {
		if c != nil {
			c.error(err)
		}
		return nil, err
	}
	if c == nil {
		return s, nil
	}
	return &countingAppend{Journal_AppendClient: s, c: c}, nil
}

type countingRead struct {
	pb.Journal_ReadClient
	c *counters
}

func (s *countingRead) RecvMsg(m any) error {
	var err = s.Journal_ReadClient.RecvMsg(m)
	if err != nil {
		s.c.error(err)
	} else if resp, ok := m.(*pb.ReadResponse); ok {
		if verr := resp.Validate(); verr != nil {
			s.c.invalid(pb.ExtendContext(verr, "ReadResponse"))
		}
	}
	return err
}

func (s *countingRead) Recv() (*pb.ReadResponse, error) {
	var m = new(pb.ReadResponse)
	if err := s.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

type countingAppend struct {
	pb.Journal_AppendClient
	c    *counters
	done bool
}

func (s *countingAppend) RecvMsg(m any) error {
	var err = s.Journal_AppendClient.RecvMsg(m)
	if s.done {
		return err // The client's extra read of the stream's end.
	}
	s.done = true
	if err != nil {
		s.c.error(err)
	} else if resp, ok := m.(*pb.AppendResponse); ok {
		if verr := resp.Validate(); verr != nil {
			s.c.invalid(pb.ExtendContext(verr, "AppendResponse"))
		}
	}
	return err
}

func (s *countingAppend) CloseAndRecv() (*pb.AppendResponse, error) {
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	var m = new(pb.AppendResponse)
	if err := s.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// warnHook counts the client's warnings by message ("read failure (will retry)", ...).
type warnHook struct {
	mu     sync.Mutex
	counts map[string]int64
}

func (h *warnHook) Levels() []log.Level { return []log.Level{log.WarnLevel, log.ErrorLevel} }

func (h *warnHook) Fire(e *log.Entry) error {
	h.mu.Lock()
	h.counts[e.Message]++
	h.mu.Unlock()
	return nil
}

// soak is one run.
type soak struct {
	cfg     config
	ctx     context.Context
	rjc     pb.RoutedJournalClient
	started time.Time
	killed  time.Time // Zero unless -kill-pid was killed.
	killMu  sync.Mutex
}

func (s *soak) client(ep pb.Endpoint) pb.RoutedJournalClient {
	var cc = mbp.ClientConfig{AddressConfig: mbp.AddressConfig{Address: ep}}
	cc.Cache.Size = 1024
	cc.Cache.TTL = time.Minute
	return pb.NewRoutedJournalClient(countingClient{cc.MustJournalClient(s.ctx)}, cc.BuildRouter())
}

func (s *soak) journal(i int) pb.Journal {
	return pb.Journal(fmt.Sprintf("%sj%02d", s.cfg.prefix, i))
}

type appender struct {
	id       string
	service  bool // AppendService, else client.Append.
	c        *counters
	acked    int            // Records acknowledged: 1..acked.
	retried  map[int]bool   // Records whose append took more than one RPC (in doubt).
	failures map[string]int // Errors the client returned, by message.
	retries  []time.Time    // When each extra RPC was found.
}

type reader struct {
	journal  int
	broker   pb.Endpoint
	hop      bool
	late     bool         // Reads from the victim, with no route cache.
	hops     atomic.Int64 // Read RPCs the reader started itself (a hopper's new readers).
	c        *counters
	records  map[string][]int // Sequence numbers read, by appender, in order.
	bad      []string         // Records that could not be parsed.
	offset   int64
	err      error
	opens    []time.Time // When each Read RPC beyond the first was seen started.
	lastRPCs int64
}

func run(cfg config) (map[string]any, error) {
	pb.RegisterGRPCDispatcher("local")
	if cfg.fileRoot != "" {
		defer client.InstallFileTransport(cfg.fileRoot)()
	}
	var hook = &warnHook{counts: map[string]int64{}}
	log.AddHook(hook)
	log.SetLevel(log.WarnLevel)
	log.SetOutput(io.Discard) // Counted by the hook; the JSON says what happened.

	var ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	var s = &soak{cfg: cfg, ctx: ctx}
	s.rjc = s.client(cfg.brokers[0])

	if err := s.createJournals(); err != nil {
		return nil, fmt.Errorf("creating journals: %w", err)
	}
	// Where each journal's records start.
	var starts = make([]int64, cfg.journals)
	for j := range starts {
		var resp, err = client.Append(ctx, s.rjc, pb.AppendRequest{Journal: s.journal(j)})
		if err != nil {
			return nil, fmt.Errorf("first append: %w", err)
		}
		starts[j] = resp.Commit.End
	}

	// Readers: blocking, from each journal's start, each client dialed to another broker.
	var readers []*reader
	var readersMu sync.Mutex // The watcher's view, as late readers join.
	var readCtx, stopReaders = context.WithCancel(ctx)
	defer stopReaders()
	var readersDone sync.WaitGroup
	for j := 0; j < cfg.journals; j++ {
		for r := 0; r < cfg.readers+cfg.hoppers; r++ {
			var rd = &reader{
				journal: j,
				broker:  cfg.brokers[(j+r)%len(cfg.brokers)],
				hop:     r >= cfg.readers,
				c:       &counters{errs: map[string]int64{}},
				records: map[string][]int{},
				offset:  starts[j],
			}
			readers = append(readers, rd)
			readersDone.Add(1)
			go func() {
				defer readersDone.Done()
				s.read(readCtx, rd)
			}()
		}
	}

	// Appenders.
	s.started = time.Now()
	var appendCtx, stopAppends = context.WithTimeout(ctx, cfg.duration)
	defer stopAppends()
	var appenders = make([][]*appender, cfg.journals)
	var appendersDone sync.WaitGroup
	for j := 0; j < cfg.journals; j++ {
		for a := 0; a < cfg.appenders; a++ {
			var ap = &appender{
				id:       fmt.Sprintf("j%02da%02d", j, a),
				service:  a%2 == 1,
				c:        &counters{errs: map[string]int64{}},
				retried:  map[int]bool{},
				failures: map[string]int{},
			}
			appenders[j] = append(appenders[j], ap)
			appendersDone.Add(1)
			go func(j int) {
				defer appendersDone.Done()
				s.append(appendCtx, ap, s.journal(j))
			}(j)
		}
	}
	// Readers' RPCs are watched for retries while the run goes.
	var watchDone, watchExited = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchExited)
		var t = time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				readersMu.Lock()
				var current = readers
				readersMu.Unlock()
				for _, rd := range current {
					if n := rd.c.rpcs.Load() - rd.hops.Load(); n > rd.lastRPCs {
						for k := max(rd.lastRPCs, 1); k < n; k++ {
							rd.opens = append(rd.opens, now)
						}
						rd.lastRPCs = n
					}
				}
			case <-watchDone:
				return
			}
		}
	}()

	if cfg.killPid != 0 {
		go func() {
			select {
			case <-time.After(cfg.killAfter):
				s.killMu.Lock()
				s.killed = time.Now()
				s.killMu.Unlock()
				_ = syscall.Kill(cfg.killPid, syscall.SIGKILL)
				fmt.Fprintf(os.Stderr, "soak: killed %d\n", cfg.killPid)
			case <-appendCtx.Done():
			}
		}()
	}
	appendersDone.Wait()
	var wrote = time.Since(s.started)

	// The write heads the readers must reach.
	var heads = make([]int64, cfg.journals)
	var headCtx, headCancel = context.WithTimeout(ctx, cfg.drain)
	defer headCancel()
	for j := range heads {
		var resp, err = client.Append(headCtx, s.rjc, pb.AppendRequest{Journal: s.journal(j)})
		if err != nil {
			return nil, fmt.Errorf("write head of %s: %w", s.journal(j), err)
		}
		heads[j] = resp.Commit.End
	}
	var lateErr error
	if cfg.victim != "" {
		lateErr = s.awaitServing(headCtx, cfg.victim)
		for j := 0; lateErr == nil && j < cfg.journals; j++ {
			var rd = &reader{
				journal: j,
				broker:  cfg.victim,
				late:    true,
				c:       &counters{errs: map[string]int64{}},
				records: map[string][]int{},
				offset:  starts[j],
			}
			readersMu.Lock()
			readers = append(readers, rd)
			readersMu.Unlock()
			readersDone.Add(1)
			go func() {
				defer readersDone.Done()
				s.read(readCtx, rd)
			}()
		}
	}
	var drainStart = time.Now()
	var drainDeadline = drainStart.Add(cfg.drain)
	for {
		var behind = 0
		for _, rd := range readers {
			if atomic.LoadInt64(&rd.offset) < heads[rd.journal] {
				behind++
			}
		}
		if behind == 0 || time.Now().After(drainDeadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var drained = time.Since(drainStart)
	stopReaders()
	readersDone.Wait()
	close(watchDone)
	<-watchExited

	var out = s.report(appenders, readers, heads, starts, hook, wrote, drained)
	if cfg.victim != "" {
		var late = map[string]any{"readers": 0}
		if lateErr != nil {
			late["error"] = lateErr.Error()
		}
		for _, rd := range readers {
			if rd.late {
				late["readers"] = late["readers"].(int) + 1
			}
		}
		out["late_readers"] = late
	}
	return out, nil
}

// awaitServing waits until the broker at ep answers a List of the run's journals with all
// of them assigned their full replication (the restarted victim is back in their routes).
func (s *soak) awaitServing(ctx context.Context, ep pb.Endpoint) error {
	var cc = mbp.ClientConfig{AddressConfig: mbp.AddressConfig{Address: ep}}
	var jc = pb.NewRoutedJournalClient(cc.MustJournalClient(s.ctx), pb.NoopDispatchRouter{})
	for {
		var lctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		var resp, err = client.ListAllJournals(lctx, jc, pb.ListRequest{
			Selector: pb.LabelSelector{Include: pb.MustLabelSet("prefix", s.cfg.prefix)},
		})
		cancel()
		if err == nil {
			var full = 0
			for _, j := range resp.Journals {
				for _, m := range j.Route.Endpoints {
					if m == ep && len(j.Route.Members) == int(s.cfg.replication) {
						full++
					}
				}
			}
			if full == s.cfg.journals {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not serve the journals again: %v", ep, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *soak) createJournals() error {
	var req = new(pb.ApplyRequest)
	for j := 0; j < s.cfg.journals; j++ {
		var spec = &pb.JournalSpec{
			Name:        s.journal(j),
			Replication: s.cfg.replication,
			LabelSet:    pb.MustLabelSet(labels.ContentType, labels.ContentType_JSONLines),
			Fragment: pb.JournalSpec_Fragment{
				Length:           1 << 20, // Spools roll during the run.
				CompressionCodec: pb.CompressionCodec_NONE,
				Stores:           []pb.FragmentStore{"file:///"},
				RefreshInterval:  5 * time.Second,
			},
		}
		if err := spec.Validate(); err != nil {
			return err
		}
		req.Changes = append(req.Changes, pb.ApplyRequest_Change{Upsert: spec})
	}
	if _, err := client.ApplyJournals(s.ctx, s.rjc, req); err != nil {
		return err
	}
	var deadline = time.Now().Add(2 * time.Minute)
	for {
		var resp, err = client.ListAllJournals(s.ctx, s.rjc, pb.ListRequest{
			Selector: pb.LabelSelector{Include: pb.MustLabelSet("prefix", s.cfg.prefix)},
		})
		if err != nil {
			return err
		}
		var ready = 0
		for _, j := range resp.Journals {
			if j.Route.Primary >= 0 && len(j.Route.Members) == int(s.cfg.replication) {
				ready++
			}
		}
		if ready == s.cfg.journals {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d journals assigned with %d replicas", ready, s.cfg.journals, s.cfg.replication)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// record is the content of one record: "<appender> <seq> <padding>\n".
func (s *soak) record(id string, seq int) []byte {
	var b = []byte(fmt.Sprintf("%s %09d ", id, seq))
	b = append(b, bytes.Repeat([]byte("x"), s.cfg.recordSize-len(b)-1)...)
	return append(b, '\n')
}

func (s *soak) append(ctx context.Context, ap *appender, journal pb.Journal) {
	var cctx = withCounters(s.ctx, ap.c) // RPCs outlive ctx: a started record finishes.
	var svc *client.AppendService
	if ap.service {
		svc = client.NewAppendService(cctx, s.rjc)
	}
	for seq := 1; ctx.Err() == nil; seq++ {
		var content = s.record(ap.id, seq)
		for attempt := 0; ; attempt++ {
			var before = ap.c.rpcs.Load()
			var err error
			if ap.service {
				var aa = svc.StartAppend(pb.AppendRequest{Journal: journal}, nil)
				_, _ = aa.Writer().Write(content)
				if err = aa.Release(); err == nil {
					<-aa.Done()
					err = aa.Err()
				}
			} else {
				_, err = client.Append(cctx, s.rjc, pb.AppendRequest{Journal: journal},
					bytes.NewReader(content))
			}
			if extra := ap.c.rpcs.Load() - before - 1; extra > 0 || err != nil {
				ap.retried[seq] = true
				var now = time.Now()
				for k := int64(0); k < extra; k++ {
					ap.retries = append(ap.retries, now)
				}
			}
			if err == nil {
				ap.acked = seq
				break
			}
			// The client gave up on this record (it returns what it does not retry): we
			// retry it ourselves, so it may be in the journal twice.
			ap.failures[err.Error()]++
			ap.retries = append(ap.retries, time.Now())
			if svc != nil {
				svc = client.NewAppendService(cctx, s.rjc) // A failed service stays failed.
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

func (s *soak) read(ctx context.Context, rd *reader) {
	var rjc = s.client(rd.broker)
	if rd.late {
		// No route cache: every Read RPC goes to the victim, which serves it or proxies it.
		var cc = mbp.ClientConfig{AddressConfig: mbp.AddressConfig{Address: rd.broker}}
		rjc = pb.NewRoutedJournalClient(countingClient{cc.MustJournalClient(s.ctx)}, pb.NoopDispatchRouter{})
	}
	var rr = client.NewRetryReader(withCounters(ctx, rd.c), rjc,
		pb.ReadRequest{Journal: s.journal(rd.journal), Offset: rd.offset, Block: true})
	defer func() { rr.Cancel() }()
	var br = bufio.NewReaderSize(rr, 64*1024)
	var opened = time.Now()
	for {
		if rd.hop && time.Since(opened) >= s.cfg.hopEvery {
			// A new Read RPC where this reader is (what it has buffered is dropped).
			var offset = rr.AdjustedOffset(br)
			rr.Cancel()
			rd.hops.Add(1)
			rr = client.NewRetryReader(withCounters(ctx, rd.c), rjc,
				pb.ReadRequest{Journal: s.journal(rd.journal), Offset: offset, Block: true})
			br = bufio.NewReaderSize(rr, 64*1024)
			opened = time.Now()
		}
		var line, err = br.ReadBytes('\n')
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				rd.err = err
			}
			return
		}
		atomic.StoreInt64(&rd.offset, rr.AdjustedOffset(br))
		var fields = bytes.Fields(line)
		if len(fields) != 3 {
			rd.bad = append(rd.bad, string(line[:min(len(line), 64)]))
			continue
		}
		var seq, perr = strconv.Atoi(string(fields[1]))
		if perr != nil {
			rd.bad = append(rd.bad, string(line[:min(len(line), 64)]))
			continue
		}
		var id = string(fields[0])
		rd.records[id] = append(rd.records[id], seq)
	}
}

func (s *soak) since(t time.Time) float64 { return round(t.Sub(s.started).Seconds()) }

func (s *soak) report(appenders [][]*appender, readers []*reader, heads, starts []int64,
	hook *warnHook, wrote, drained time.Duration) map[string]any {

	var acked, appendRPCs, appendValidation, appendRefused int64
	var appendErrs = map[string]int64{}
	var failures = map[string]int{}
	var validationSamples []string
	var retryTimes []time.Time
	var byID = map[string]*appender{}
	for _, aps := range appenders {
		for _, ap := range aps {
			byID[ap.id] = ap
			acked += int64(ap.acked)
			appendRPCs += ap.c.rpcs.Load()
			appendValidation += ap.c.validation.Load()
			appendRefused += ap.c.refused.Load()
			for k, v := range ap.c.errs {
				appendErrs[k] += v
			}
			for k, v := range ap.failures {
				failures[k] += v
			}
			validationSamples = append(validationSamples, ap.c.validations...)
			retryTimes = append(retryTimes, ap.retries...)
		}
	}
	var appendRetries = int64(len(retryTimes))

	// Every reader against every appender of its journal.
	var readRPCs, readHops, readValidation, readRefused, readRetries int64
	var readErrs = map[string]int64{}
	var readTimes []time.Time
	var missing, duplicates, unexplainedDuplicates, outOfOrder, strangers, unread int64
	var problems []string
	var note = func(format string, args ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for _, rd := range readers {
		readRPCs += rd.c.rpcs.Load()
		readHops += rd.hops.Load()
		readValidation += rd.c.validation.Load()
		readRefused += rd.c.refused.Load()
		readRetries += max(rd.c.rpcs.Load()-rd.hops.Load()-1, 0)
		readTimes = append(readTimes, rd.opens...)
		for k, v := range rd.c.errs {
			readErrs[k] += v
		}
		validationSamples = append(validationSamples, rd.c.validations...)
		if rd.err != nil {
			note("reader of j%02d on %s: %v", rd.journal, rd.broker, rd.err)
		}
		if rd.offset < heads[rd.journal] {
			unread++
			note("reader of j%02d on %s stopped at %d of %d", rd.journal, rd.broker, rd.offset, heads[rd.journal])
		}
		if len(rd.bad) != 0 {
			strangers += int64(len(rd.bad))
			note("reader of j%02d read unparseable records: %q", rd.journal, rd.bad[0])
		}
		var own = map[string]bool{}
		for _, ap := range appenders[rd.journal] {
			own[ap.id] = true
			var seqs = rd.records[ap.id]
			var next = 1 // The next new record expected.
			for _, seq := range seqs {
				switch {
				case seq == next:
					next++
				case seq == next-1:
					duplicates++
					if !ap.retried[seq] {
						unexplainedDuplicates++
						note("reader of j%02d read %s #%d twice; its append was not retried", rd.journal, ap.id, seq)
					}
				default:
					outOfOrder++
					note("reader of j%02d read %s #%d after #%d", rd.journal, ap.id, seq, next-1)
					next = max(next, seq+1)
				}
			}
			if next-1 < ap.acked {
				missing += int64(ap.acked - (next - 1))
				note("reader of j%02d read %s up to #%d of #%d acknowledged", rd.journal, ap.id, next-1, ap.acked)
			}
		}
		for id, seqs := range rd.records {
			if !own[id] {
				strangers += int64(len(seqs))
				note("reader of j%02d read %d records of %s", rd.journal, len(seqs), id)
			}
		}
	}

	var timing = func(ts []time.Time) map[string]any {
		var out = map[string]any{"count": len(ts)}
		if len(ts) == 0 {
			return out
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		out["first_s"] = s.since(ts[0])
		out["last_s"] = s.since(ts[len(ts)-1])
		if !s.killed.IsZero() {
			var before = 0
			for _, t := range ts {
				if t.Before(s.killed) {
					before++
				}
			}
			out["before_kill"] = before
			out["first_after_kill_s"] = round(ts[0].Sub(s.killed).Seconds())
			out["last_after_kill_s"] = round(ts[len(ts)-1].Sub(s.killed).Seconds())
		}
		return out
	}
	var bytesWritten int64
	for j := range heads {
		bytesWritten += heads[j] - starts[j]
	}
	var out = map[string]any{
		"client":        "go.gazette.dev/core v0.103.0 broker/client",
		"brokers":       s.cfg.brokers,
		"replication":   s.cfg.replication,
		"journals":      s.cfg.journals,
		"appenders":     s.cfg.journals * s.cfg.appenders,
		"readers":       len(readers),
		"seconds":       round(wrote.Seconds()),
		"drain_s":       round(drained.Seconds()),
		"records_acked": acked,
		"records_per_s": round(float64(acked) / wrote.Seconds()),
		"bytes":         bytesWritten,
		// Responses Gazette's client rejected, and ones a checking pygazette broker refused
		// to send (it aborts the stream INTERNAL "response failed validation").
		"validation_errors": map[string]int64{
			"read": readValidation, "append": appendValidation,
			"read_refused_by_broker": readRefused, "append_refused_by_broker": appendRefused,
			"total": readValidation + appendValidation + readRefused + appendRefused,
		},
		"validation_samples": validationSamples[:min(len(validationSamples), 5)],
		"append": map[string]any{
			"rpcs":            appendRPCs,
			"retries":         appendRetries,
			"retry_times":     timing(retryTimes),
			"stream_errors":   appendErrs,
			"client_errors":   failures,
			"records_retried": countRetried(byID),
		},
		"read": map[string]any{
			"rpcs":          readRPCs,
			"hopper_rpcs":   readHops,
			"retries":       readRetries,
			"retry_times":   timing(readTimes),
			"stream_errors": readErrs,
		},
		"client_warnings": hook.counts,
		"check": map[string]any{
			"records_read_per_reader": acked,
			"missing":                 missing,
			"duplicates":              duplicates,
			"unexplained_duplicates":  unexplainedDuplicates,
			"out_of_order":            outOfOrder,
			"foreign_or_unparseable":  strangers,
			"readers_short_of_head":   unread,
			"exactly_once_in_order": missing == 0 && unexplainedDuplicates == 0 && outOfOrder == 0 &&
				strangers == 0 && unread == 0,
			"problems": problems,
		},
	}
	if s.cfg.killPid != 0 {
		var killed any = nil
		if !s.killed.IsZero() {
			killed = s.since(s.killed)
		}
		out["killed_pid"] = s.cfg.killPid
		out["killed_at_s"] = killed
	}
	return out
}

func countRetried(byID map[string]*appender) int {
	var n = 0
	for _, ap := range byID {
		n += len(ap.retried)
	}
	return n
}

func round(x float64) float64 {
	if x < 0 {
		return -float64(int64(-x*1000+0.5)) / 1000
	}
	return float64(int64(x*1000+0.5)) / 1000
}
