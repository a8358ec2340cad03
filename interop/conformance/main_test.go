// Package conformance runs Gazette's own broker client (go.gazette.dev/core/broker/client)
// against brokers started by the harness: pygazette, and the released Gazette broker as the
// reference. Every test runs against each broker named in $INTEROP_BROKERS (default: both),
// so an expectation that holds for Gazette's broker is checked against pygazette's.
package conformance

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	pb "go.gazette.dev/core/broker/protocol"
	mbp "go.gazette.dev/core/mainboilerplate"
	"pygazette.dev/interop/harness"
)

var brokers []*harness.Broker

func TestMain(m *testing.M) {
	// Gazette's clients dial the endpoints of journal routes through this dispatcher.
	pb.RegisterGRPCDispatcher("local")

	var names = strings.Split(os.Getenv("INTEROP_BROKERS"), ",")
	if os.Getenv("INTEROP_BROKERS") == "" {
		names = []string{"pygazette", "gazette"}
	}
	var scratch, err = os.MkdirTemp("", "pygazette-conformance-")
	if err != nil {
		panic(err)
	}
	for _, name := range names {
		var b, err = harness.Start(name, scratch+"/"+name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			stopAll()
			os.Exit(1)
		}
		brokers = append(brokers, b)
	}
	var code = m.Run()
	if code != 0 {
		for _, b := range brokers {
			fmt.Fprintf(os.Stderr, "=== logs of %s\n%s", b.Name, b.Logs())
		}
	}
	stopAll()
	_ = os.RemoveAll(scratch)
	os.Exit(code)
}

func stopAll() {
	for _, b := range brokers {
		b.Stop()
	}
}

// env is one test's view of one broker: a routed journal client (with a route cache, so
// requests go to the endpoints the broker's routes name) and a deadline.
type env struct {
	*testing.T
	broker *harness.Broker
	ctx    context.Context
	rjc    pb.RoutedJournalClient
	prefix string // Journals of this test live under this prefix.
}

// forEachBroker runs fn as a subtest against each broker under test.
func forEachBroker(t *testing.T, fn func(e *env)) {
	for _, b := range brokers {
		t.Run(b.Name, func(t *testing.T) {
			var ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			var cfg = mbp.ClientConfig{AddressConfig: mbp.AddressConfig{Address: b.Endpoint}}
			cfg.Cache.Size = 64
			cfg.Cache.TTL = time.Minute
			fn(&env{
				T:      t,
				broker: b,
				ctx:    ctx,
				rjc:    cfg.MustRoutedJournalClient(ctx),
				prefix: "conformance/" + strings.Split(t.Name(), "/")[0] + "/",
			})
		})
	}
}
