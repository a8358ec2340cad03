// Command loadgen drives a broker cluster — Gazette's or pygazette's, it cannot tell — with
// Gazette's own client package (go.gazette.dev/core/broker/client and core/message), and
// prints what it measured as one JSON document on stdout.
//
// It creates its journals (replication -replication) under -prefix, waits until each is
// assigned, and runs the chosen workloads:
//
//	append_4kib, append_1mib  -writers goroutines each looping client.Append (one Append
//	                          RPC per record) into one journal; appends/s, MB/s, p50/p99
//	raw_append_4kib           append_4kib's load as bare Append RPCs (no route cache or
//	                          response checks), which bench/raw_grpc_server.py — grpc.aio
//	                          with no broker behind it — answers too (-raw)
//	tail_read                 RetryReader over append_1mib's journal from offset 0 to its
//	                          write head (the spool; -big-count MiB, written first if
//	                          append_1mib did not run); MB/s
//	register_latency          sequential small appends that check and union registers,
//	                          as a consumer's recovery log writes; p50/p99
//	wakeup_latency            append → wake-up of a blocking RetryReader connected to
//	                          another broker of the journal's route; p50/p99
//	consumer                  a consumer-like loop: a producer publishes committed messages
//	                          to a source journal; the "shard" reads them (blocking, on
//	                          another broker) in transactions of -txn messages, publishing
//	                          each uncommitted to an output journal, then a checkpoint with a
//	                          register check (dependent on the outputs), then ACKs; a
//	                          downstream reader reads the output read-committed to the end;
//	                          end-to-end seconds
//
// With -cpu-pids (the brokers' process IDs), each workload also reports broker_cpu_s, the
// CPU time those processes spent while it ran.
//
// Usage (the bench/vs_gazette.py --go-client mode runs it):
//
//	loadgen -brokers http://127.0.0.1:8080,http://127.0.0.1:8081 -replication 2 \
//	    -workloads append_4kib,wakeup_latency -prefix bench/run-1/
package main

import (
	"bytes"
	"context"
	"crypto/rand"
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
	"time"

	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
	"go.gazette.dev/core/labels"
	mbp "go.gazette.dev/core/mainboilerplate"
	"go.gazette.dev/core/message"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const mib = 1 << 20

type config struct {
	brokers          []pb.Endpoint
	replication      int32
	prefix           string
	workloads        []string
	writers          int
	smallCount       int
	bigCount         int
	latencyCount     int
	wakeCount        int
	consumerMessages int
	txn              int
	timeout          time.Duration
	cpuPids          []int
	raw              bool
}

// harness is the run's clients: rjc routes each request by the journal's route (as
// Gazette applications do); readers on a chosen broker use clients without a route cache,
// which always dispatch to the address they were dialed with.
type harness struct {
	cfg     config
	ctx     context.Context
	rjc     pb.RoutedJournalClient
	mu      sync.Mutex
	pinned  map[pb.Endpoint]pb.RoutedJournalClient
	results map[string]any
}

func main() {
	var cfg config
	var brokers, workloads, pids string
	flag.StringVar(&brokers, "brokers", "http://127.0.0.1:8080", "comma-separated broker endpoints")
	var replication = flag.Int("replication", 1, "replication of the journals")
	flag.StringVar(&cfg.prefix, "prefix", "loadgen/", "journal name prefix (ends in /)")
	flag.StringVar(&workloads, "workloads",
		"append_4kib,append_1mib,tail_read,register_latency,wakeup_latency,consumer",
		"comma-separated workloads")
	flag.IntVar(&cfg.writers, "writers", 4, "concurrent writers of the append workloads")
	flag.IntVar(&cfg.smallCount, "small-count", 4000, "4 KiB appends")
	flag.IntVar(&cfg.bigCount, "big-count", 256, "1 MiB appends")
	flag.IntVar(&cfg.latencyCount, "latency-count", 500, "register-checked appends")
	flag.IntVar(&cfg.wakeCount, "wake-count", 500, "append → blocking reader round trips")
	flag.IntVar(&cfg.consumerMessages, "consumer-messages", 2000, "messages of the consumer workload")
	flag.IntVar(&cfg.txn, "txn", 10, "messages per consumer transaction")
	flag.DurationVar(&cfg.timeout, "timeout", 15*time.Minute, "give up after this long")
	flag.BoolVar(&cfg.raw, "raw", false,
		"the server is bench/raw_grpc_server.py (grpc.aio, no broker): create no journals; "+
			"only raw_append_4kib applies")
	flag.StringVar(&pids, "cpu-pids", "",
		"comma-separated broker process IDs: each workload reports their CPU time (broker_cpu_s)")
	flag.Parse()

	for _, p := range strings.Split(pids, ",") {
		if p = strings.TrimSpace(p); p != "" {
			var pid, err = strconv.Atoi(p)
			if err != nil {
				fmt.Fprintln(os.Stderr, "loadgen: -cpu-pids:", err)
				os.Exit(2)
			}
			cfg.cpuPids = append(cfg.cpuPids, pid)
		}
	}

	for _, b := range strings.Split(brokers, ",") {
		cfg.brokers = append(cfg.brokers, pb.Endpoint(strings.TrimSpace(b)))
	}
	cfg.replication = int32(*replication)
	cfg.workloads = strings.Split(workloads, ",")
	if !strings.HasSuffix(cfg.prefix, "/") {
		cfg.prefix += "/"
	}

	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	// Gazette's clients dial the endpoints of journal routes through this dispatcher.
	pb.RegisterGRPCDispatcher("local")

	var ctx, cancel = context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()

	var h = &harness{
		cfg:     cfg,
		ctx:     ctx,
		pinned:  map[pb.Endpoint]pb.RoutedJournalClient{},
		results: map[string]any{},
	}
	var cc = mbp.ClientConfig{AddressConfig: mbp.AddressConfig{Address: cfg.brokers[0]}}
	cc.Cache.Size = 1024
	cc.Cache.TTL = time.Minute
	h.rjc = cc.MustRoutedJournalClient(ctx)

	var started = time.Now()
	if !cfg.raw {
		if err := h.createJournals(); err != nil {
			return fmt.Errorf("creating journals: %w", err)
		}
	}
	h.results["setup_s"] = seconds(time.Since(started))

	for _, w := range cfg.workloads {
		var err error
		var cpu = h.brokerCPU()
		switch w {
		case "":
		case "append_4kib":
			err = h.appendThroughput(w, "append-4k", 4096, cfg.smallCount)
		case "raw_append_4kib":
			err = h.rawAppend(w, "append-4k", 4096, cfg.smallCount)
		case "append_1mib":
			err = h.appendThroughput(w, "append-1m", mib, cfg.bigCount)
		case "tail_read":
			err = h.tailRead()
		case "register_latency":
			err = h.registerLatency()
		case "wakeup_latency":
			err = h.wakeupLatency()
		case "consumer":
			err = h.consumer()
		default:
			err = fmt.Errorf("unknown workload %q", w)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", w, err)
		}
		if r, ok := h.results[w].(map[string]any); ok && len(cfg.cpuPids) != 0 {
			r["broker_cpu_s"] = round(h.brokerCPU() - cpu)
		}
	}

	var out = map[string]any{
		"client":      "go.gazette.dev/core v0.103.0 broker/client",
		"brokers":     cfg.brokers,
		"replication": cfg.replication,
		"writers":     cfg.writers,
		"results":     h.results,
	}
	var enc = json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// brokerCPU is the CPU time (user and system) the -cpu-pids processes have used so far.
func (h *harness) brokerCPU() float64 {
	const clockTicks = 100 // USER_HZ, on every Linux this runs on.
	var total float64
	for _, pid := range h.cfg.cpuPids {
		var stat, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state is [0], utime [11], stime [12].
		var fields = strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 12 {
			var utime, _ = strconv.ParseFloat(fields[11], 64)
			var stime, _ = strconv.ParseFloat(fields[12], 64)
			total += (utime + stime) / clockTicks
		}
	}
	return total
}

func (h *harness) journal(name string) pb.Journal { return pb.Journal(h.cfg.prefix + name) }

// createJournals applies every journal of the run and waits until each has a primary and
// `replication` members, then makes one append to each (the first append after an
// assignment may wait for replicas to join).
func (h *harness) createJournals() error {
	var names = []string{"append-4k", "append-1m", "registers", "wake", "source", "output", "log"}
	var req = new(pb.ApplyRequest)
	for _, n := range names {
		var spec = &pb.JournalSpec{
			Name:        h.journal(n),
			Replication: h.cfg.replication,
			LabelSet:    pb.MustLabelSet(labels.ContentType, labels.ContentType_JSONLines),
			Fragment: pb.JournalSpec_Fragment{
				// Large fragments: no spool rolls or persists during the run, on either broker.
				Length:           1 << 34,
				CompressionCodec: pb.CompressionCodec_NONE,
				Stores:           []pb.FragmentStore{"file:///"},
				RefreshInterval:  5 * time.Minute,
			},
		}
		if err := spec.Validate(); err != nil {
			return err
		}
		req.Changes = append(req.Changes, pb.ApplyRequest_Change{Upsert: spec})
	}
	if _, err := client.ApplyJournals(h.ctx, h.rjc, req); err != nil {
		return err
	}

	var deadline = time.Now().Add(2 * time.Minute)
	for {
		var resp, err = client.ListAllJournals(h.ctx, h.rjc, pb.ListRequest{
			Selector: pb.LabelSelector{Include: pb.MustLabelSet("prefix", h.cfg.prefix)},
		})
		if err != nil {
			return err
		}
		var ready = 0
		for _, j := range resp.Journals {
			if j.Route.Primary >= 0 && len(j.Route.Members) == int(h.cfg.replication) {
				ready++
			}
		}
		if ready == len(names) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d journals assigned with %d replicas", ready, len(names), h.cfg.replication)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, n := range names {
		if _, err := client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: h.journal(n)}); err != nil {
			return fmt.Errorf("first append to %s: %w", n, err)
		}
	}
	return nil
}

// route is the journal's current route, as a broker lists it.
func (h *harness) route(journal pb.Journal) (pb.Route, error) {
	var resp, err = client.ListAllJournals(h.ctx, h.rjc, pb.ListRequest{
		Selector: pb.LabelSelector{Include: pb.MustLabelSet("name", journal.String())},
	})
	if err != nil {
		return pb.Route{}, err
	}
	if len(resp.Journals) != 1 {
		return pb.Route{}, fmt.Errorf("%d listings of %s", len(resp.Journals), journal)
	}
	return resp.Journals[0].Route, nil
}

// otherBroker is a broker other than the journal's primary, to read from: a replica of
// the journal if it has one, else another broker of the cluster, else the primary itself.
func (h *harness) otherBroker(journal pb.Journal) (pb.Endpoint, error) {
	var rt, err = h.route(journal)
	if err != nil {
		return "", err
	}
	var primary = rt.Endpoints[rt.Primary]
	for i, ep := range rt.Endpoints {
		if int32(i) != rt.Primary {
			return ep, nil
		}
	}
	for _, ep := range h.cfg.brokers {
		if ep != primary {
			return ep, nil
		}
	}
	return primary, nil
}

// pinnedClient is a client of just the broker at `ep` (no route cache: every request goes
// to that broker, which serves it or proxies it).
func (h *harness) pinnedClient(ep pb.Endpoint) pb.RoutedJournalClient {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.pinned[ep]; ok {
		return c
	}
	var cc = mbp.ClientConfig{AddressConfig: mbp.AddressConfig{Address: ep}}
	var c = cc.MustRoutedJournalClient(h.ctx)
	h.pinned[ep] = c
	return c
}

func (h *harness) appendThroughput(name, journal string, size, count int) error {
	var content = make([]byte, size)
	_, _ = rand.Read(content)
	var j = h.journal(journal)

	// Warm up: connections, routes, and the journal's pipeline.
	for i := 0; i < min(8, count); i++ {
		if _, err := client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j}, bytes.NewReader(content)); err != nil {
			return err
		}
	}
	var next atomic.Int64
	var latencies = make([][]time.Duration, h.cfg.writers)
	var errs = make(chan error, h.cfg.writers)
	var started = time.Now()
	for w := 0; w < h.cfg.writers; w++ {
		go func(w int) {
			for next.Add(1) <= int64(count) {
				var t0 = time.Now()
				var _, err = client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j}, bytes.NewReader(content))
				if err != nil {
					errs <- err
					return
				}
				latencies[w] = append(latencies[w], time.Since(t0))
			}
			errs <- nil
		}(w)
	}
	for w := 0; w < h.cfg.writers; w++ {
		if err := <-errs; err != nil {
			return err
		}
	}
	var elapsed = time.Since(started)
	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	var p = percentiles(all)
	h.results[name] = map[string]any{
		"writers":       h.cfg.writers,
		"appends":       count,
		"bytes":         size,
		"seconds":       seconds(elapsed),
		"appends_per_s": round(float64(count) / elapsed.Seconds()),
		"mb_per_s":      round(float64(count*size) / elapsed.Seconds() / 1e6),
		"p50_ms":        p[0],
		"p99_ms":        p[1],
	}
	return nil
}

// rawAppend is appendThroughput's load as bare Append RPCs on a plain gRPC connection to
// the first broker (no route cache, no response validation): the same RPC shape Gazette's
// client sends, which a bare grpc.aio server (bench/raw_grpc_server.py) can answer too.
func (h *harness) rawAppend(name, journal string, size, count int) error {
	var conn, err = grpc.NewClient(h.cfg.brokers[0].GRPCAddr(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	var jc = pb.NewJournalClient(conn)
	var content = make([]byte, size)
	_, _ = rand.Read(content)
	var j = h.journal(journal)

	var appendOnce = func() error {
		var stream, err = jc.Append(h.ctx)
		if err != nil {
			return err
		}
		for _, req := range []*pb.AppendRequest{{Journal: j}, {Content: content}, {}} {
			if err = stream.Send(req); err != nil {
				return err
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			return err
		}
		if resp.Status != pb.Status_OK {
			return fmt.Errorf("append: %s", resp.Status)
		}
		return nil
	}
	for i := 0; i < min(8, count); i++ {
		if err := appendOnce(); err != nil {
			return err
		}
	}
	var next atomic.Int64
	var latencies = make([][]time.Duration, h.cfg.writers)
	var errs = make(chan error, h.cfg.writers)
	var started = time.Now()
	for w := 0; w < h.cfg.writers; w++ {
		go func(w int) {
			for next.Add(1) <= int64(count) {
				var t0 = time.Now()
				if err := appendOnce(); err != nil {
					errs <- err
					return
				}
				latencies[w] = append(latencies[w], time.Since(t0))
			}
			errs <- nil
		}(w)
	}
	for w := 0; w < h.cfg.writers; w++ {
		if err := <-errs; err != nil {
			return err
		}
	}
	var elapsed = time.Since(started)
	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	var p = percentiles(all)
	h.results[name] = map[string]any{
		"writers":       h.cfg.writers,
		"appends":       count,
		"bytes":         size,
		"seconds":       seconds(elapsed),
		"appends_per_s": round(float64(count) / elapsed.Seconds()),
		"mb_per_s":      round(float64(count*size) / elapsed.Seconds() / 1e6),
		"p50_ms":        p[0],
		"p99_ms":        p[1],
	}
	return nil
}

func (h *harness) tailRead() error {
	var j = h.journal("append-1m")
	var resp, err = client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j})
	if err != nil {
		return err
	}
	var head = resp.Commit.End
	// Run alone (without append_1mib first), it writes what it reads, untimed.
	var chunk = make([]byte, mib)
	for ; head < int64(h.cfg.bigCount)*mib; head = resp.Commit.End {
		if resp, err = client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j}, bytes.NewReader(chunk)); err != nil {
			return err
		}
	}
	var started = time.Now()
	var rr = client.NewRetryReader(h.ctx, h.rjc, pb.ReadRequest{Journal: j, Offset: 0, Block: true})
	defer rr.Cancel()
	var buf = make([]byte, mib)
	var total int64
	for total < head {
		var n, err = rr.Read(buf[:min(int64(len(buf)), head-total)])
		total += int64(n)
		if err != nil && !errors.Is(err, client.ErrOffsetJump) {
			return err
		}
	}
	var elapsed = time.Since(started)
	h.results["tail_read"] = map[string]any{
		"bytes":    total,
		"seconds":  seconds(elapsed),
		"mb_per_s": round(float64(total) / elapsed.Seconds() / 1e6),
	}
	return nil
}

func (h *harness) registerLatency() error {
	var j = h.journal("registers")
	var owner = pb.MustLabelSet("owner", "loadgen")
	// Gazette refuses a register change by an empty append.
	if _, err := client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j, UnionRegisters: &owner},
		bytes.NewReader([]byte("owner\n"))); err != nil {
		return err
	}
	var check = &pb.LabelSelector{Include: owner}
	var content = bytes.Repeat([]byte("r"), 255)
	content = append(content, '\n')

	var lat []time.Duration
	for i := 0; i < h.cfg.latencyCount+10; i++ {
		var t0 = time.Now()
		var resp, err = client.Append(h.ctx, h.rjc,
			pb.AppendRequest{Journal: j, CheckRegisters: check, UnionRegisters: &owner},
			bytes.NewReader(content))
		if err != nil {
			return err
		}
		if !resp.Registers.Equal(owner) {
			return fmt.Errorf("registers %v after the append, not %v", resp.Registers, owner)
		}
		if i >= 10 { // The first ten warm up.
			lat = append(lat, time.Since(t0))
		}
	}
	var p = percentiles(lat)
	h.results["register_latency"] = map[string]any{
		"appends": len(lat), "bytes": len(content), "p50_ms": p[0], "p99_ms": p[1],
	}
	return nil
}

func (h *harness) wakeupLatency() error {
	var j = h.journal("wake")
	var resp, err = client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j})
	if err != nil {
		return err
	}
	var reader pb.Endpoint
	if reader, err = h.otherBroker(j); err != nil {
		return err
	}
	var rr = client.NewRetryReader(h.ctx, h.pinnedClient(reader),
		pb.ReadRequest{Journal: j, Offset: resp.Commit.End, Block: true})
	defer rr.Cancel()

	const size = 64
	var woke = make(chan time.Time)
	var readErr = make(chan error, 1)
	var n = h.cfg.wakeCount + 10
	go func() {
		var buf = make([]byte, size)
		for i := 0; i < n; i++ {
			if _, err := io.ReadFull(rr, buf); err != nil {
				readErr <- err
				return
			}
			woke <- time.Now()
		}
		readErr <- nil
	}()

	var content = bytes.Repeat([]byte("w"), size)
	var wake, commit []time.Duration
	for i := 0; i < n; i++ {
		var t0 = time.Now()
		if _, err := client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j}, bytes.NewReader(content)); err != nil {
			return err
		}
		var committed = time.Since(t0)
		select {
		case t := <-woke:
			if i >= 10 {
				wake = append(wake, t.Sub(t0))
				commit = append(commit, committed)
			}
		case err := <-readErr:
			return fmt.Errorf("reader on %s: %v", reader, err)
		case <-h.ctx.Done():
			return h.ctx.Err()
		}
	}
	var pw, pc = percentiles(wake), percentiles(commit)
	h.results["wakeup_latency"] = map[string]any{
		"round_trips":   len(wake),
		"reader_broker": reader,
		"p50_ms":        pw[0],
		"p99_ms":        pw[1],
		"commit_p50_ms": pc[0],
		"commit_p99_ms": pc[1],
	}
	return nil
}

// event is a JSON message of the consumer workload.
type event struct {
	UUID message.UUID
	N    int
	Pad  string
}

func (m *event) GetUUID() message.UUID                         { return m.UUID }
func (m *event) SetUUID(uuid message.UUID)                     { m.UUID = uuid }
func (m *event) NewAcknowledgement(pb.Journal) message.Message { return new(event) }

func newEvent(*pb.JournalSpec) (message.Message, error) { return new(event), nil }

func to(j pb.Journal) message.MappingFunc {
	return func(message.Mappable) (pb.Journal, string, error) {
		return j, labels.ContentType_JSONLines, nil
	}
}

func (h *harness) consumer() error {
	var src, out, log = h.journal("source"), h.journal("output"), h.journal("log")
	var total, txn = h.cfg.consumerMessages, h.cfg.txn
	var pad = strings.Repeat("p", 100)

	var srcReader, err = h.otherBroker(src)
	if err != nil {
		return err
	}
	outReader, err := h.otherBroker(out)
	if err != nil {
		return err
	}
	// Where each journal's new messages start (its first append was made at creation).
	var offsets = map[pb.Journal]pb.Offset{}
	for _, j := range []pb.Journal{src, out} {
		var resp, err = client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: j})
		if err != nil {
			return err
		}
		offsets[j] = resp.Commit.End
	}
	// The shard's fencing register on its log.
	var owner = pb.MustLabelSet("shard", "loadgen")
	if _, err = client.Append(h.ctx, h.rjc, pb.AppendRequest{Journal: log, UnionRegisters: &owner},
		bytes.NewReader([]byte("owner\n"))); err != nil {
		return err
	}
	var ctx, cancel = context.WithCancel(h.ctx)
	defer cancel()
	var errs = make(chan error, 3)
	var started = time.Now()

	// Producer: committed messages into the source, as fast as its AppendService takes them.
	go func() {
		var svc = client.NewAppendService(ctx, h.rjc)
		var pub = message.NewPublisher(svc, nil)
		var last *client.AsyncAppend
		for i := 0; i < total; i++ {
			var aa, err = pub.PublishCommitted(to(src), &event{N: i, Pad: pad})
			if err != nil {
				errs <- err
				return
			}
			last = aa
		}
		<-last.Done()
		errs <- last.Err()
	}()

	// The shard: transactions of `txn` messages read (blocking) from the source, each
	// published uncommitted to the output, a checkpoint on the log that depends on them and
	// checks the shard's register, then the ACKs.
	go func() {
		var rr = client.NewRetryReader(ctx, h.pinnedClient(srcReader),
			pb.ReadRequest{Journal: src, Offset: offsets[src], Block: true})
		defer rr.Cancel()
		var it = message.NewReadCommittedIter(rr, newEvent, message.NewSequencer(nil, nil, 16))
		var svc = client.NewAppendService(ctx, h.rjc)
		var pub = message.NewPublisher(svc, nil)
		var check = &pb.LabelSelector{Include: owner}
		var checkpoint = bytes.Repeat([]byte("c"), 127)
		checkpoint = append(checkpoint, '\n')

		for seen := 0; seen < total; {
			var deps = client.OpFutures{}
			for k := 0; k < txn && seen < total; {
				var env, err = it.Next()
				if err != nil {
					errs <- err
					return
				}
				if message.GetFlags(env.Message.GetUUID()) == message.Flag_ACK_TXN {
					continue
				}
				var in = env.Message.(*event)
				aa, err := pub.PublishUncommitted(to(out), &event{N: in.N, Pad: pad})
				if err != nil {
					errs <- err
					return
				}
				deps[aa] = struct{}{}
				k++
				seen++
			}
			var cp = svc.StartAppend(pb.AppendRequest{Journal: log, CheckRegisters: check}, deps)
			_, _ = cp.Writer().Write(checkpoint)
			if err := cp.Release(); err != nil {
				errs <- err
				return
			}
			<-cp.Done()
			if err := cp.Err(); err != nil {
				errs <- fmt.Errorf("checkpoint: %w", err)
				return
			}
			var intents, err = pub.BuildAckIntents()
			if err != nil {
				errs <- err
				return
			}
			for _, intent := range intents {
				var aa = svc.StartAppend(pb.AppendRequest{Journal: intent.Journal}, client.OpFutures{cp: {}})
				_, _ = aa.Writer().Write(intent.Intent)
				if err := aa.Release(); err != nil {
					errs <- err
					return
				}
			}
		}
		errs <- nil
	}()

	// Downstream: the output, read committed, until every message is seen.
	var downstream = make(chan error, 1)
	go func() {
		var rr = client.NewRetryReader(ctx, h.pinnedClient(outReader),
			pb.ReadRequest{Journal: out, Offset: offsets[out], Block: true})
		defer rr.Cancel()
		var it = message.NewReadCommittedIter(rr, newEvent, message.NewSequencer(nil, nil, 16))
		for seen := 0; seen < total; {
			var env, err = it.Next()
			if err != nil {
				downstream <- err
				return
			}
			if message.GetFlags(env.Message.GetUUID()) != message.Flag_ACK_TXN {
				seen++
			}
		}
		downstream <- nil
	}()

	for pending := 2; pending > 0; pending-- {
		if err := <-errs; err != nil {
			return err
		}
	}
	if err := <-downstream; err != nil {
		return fmt.Errorf("downstream: %w", err)
	}
	var elapsed = time.Since(started)
	h.results["consumer"] = map[string]any{
		"messages":          total,
		"transactions":      (total + txn - 1) / txn,
		"seconds":           seconds(elapsed),
		"messages_per_s":    round(float64(total) / elapsed.Seconds()),
		"source_reader":     srcReader,
		"downstream_reader": outReader,
	}
	return nil
}

func percentiles(d []time.Duration) [2]float64 {
	if len(d) == 0 {
		return [2]float64{}
	}
	var s = append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var at = func(q float64) float64 {
		var i = int(q * float64(len(s)-1))
		return round(float64(s[i].Microseconds()) / 1000)
	}
	return [2]float64{at(0.50), at(0.99)}
}

func seconds(d time.Duration) float64 { return round(d.Seconds()) }

func round(x float64) float64 {
	return float64(int64(x*1000+0.5)) / 1000
}
