package conformance

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
	"go.gazette.dev/core/labels"
	"go.gazette.dev/core/message"
)

// event is a JSON message: it carries its UUID, as Gazette's message layer requires.
type event struct {
	UUID message.UUID
	Key  string
	N    int
}

func (m *event) GetUUID() message.UUID                         { return m.UUID }
func (m *event) SetUUID(uuid message.UUID)                     { m.UUID = uuid }
func (m *event) NewAcknowledgement(pb.Journal) message.Message { return new(event) }

func newEvent(*pb.JournalSpec) (message.Message, error) { return new(event), nil }

// Gazette's own message layer — publisher, transactions, read-committed iteration — over
// the broker: the broker only sees appends and reads, and must serve them faithfully.
func TestMessages(t *testing.T) {
	forEachBroker(t, func(e *env) {
		var parts []*pb.JournalSpec
		for i := 0; i < 3; i++ {
			parts = append(parts, e.spec(fmt.Sprintf("events/part-%d", i), pb.CompressionCodec_SNAPPY,
				labels.ContentType, labels.ContentType_JSONLines, "topic", "events"))
		}
		e.create(parts...)

		var sel, err = pb.ParseLabelSelector("prefix=" + e.prefix + "events/")
		require.NoError(e, err)
		var updates = make(chan error, 1)
		var partitions = client.NewWatchedList(e.ctx, e.rjc, pb.ListRequest{Selector: sel}, updates)
		require.NoError(e, <-updates)

		var svc = client.NewAppendService(e.ctx, e.rjc)
		var pub = message.NewPublisher(svc, nil)
		var mapping = message.ModuloMapping(
			func(m message.Mappable, w io.Writer) { _, _ = w.Write([]byte(m.(*event).Key)) },
			partitions.List,
		)

		// Committed messages; a transaction that is acknowledged; one that never is.
		var want []string
		var last *client.AsyncAppend
		for i := 0; i < 30; i++ {
			last, err = pub.PublishCommitted(mapping, &event{Key: fmt.Sprint("k", i%7), N: i})
			require.NoError(e, err)
			want = append(want, fmt.Sprint("committed ", i))
		}
		for i := 0; i < 20; i++ {
			_, err = pub.PublishUncommitted(mapping, &event{Key: fmt.Sprint("k", i%5), N: 100 + i})
			require.NoError(e, err)
			want = append(want, fmt.Sprint("committed ", 100+i))
		}
		intents, err := pub.BuildAckIntents()
		require.NoError(e, err)
		for _, intent := range intents {
			var aa = svc.StartAppend(pb.AppendRequest{Journal: intent.Journal}, nil)
			_, _ = aa.Writer().Write(intent.Intent)
			require.NoError(e, aa.Release())
			last = aa
		}
		<-last.Done()
		require.NoError(e, last.Err())

		var pending = message.NewPublisher(svc, nil)
		for i := 0; i < 10; i++ {
			last, err = pending.PublishUncommitted(mapping, &event{Key: fmt.Sprint("k", i), N: 200 + i})
			require.NoError(e, err)
		}
		<-last.Done()
		for _, p := range parts { // Every append to every partition has finished.
			var aa = svc.StartAppend(pb.AppendRequest{Journal: p.Name}, nil)
			require.NoError(e, aa.Release())
			<-aa.Done()
		}

		// Read committed: acknowledged messages only, each once, in order per key.
		var got []string
		for _, p := range parts {
			var rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: p.Name})
			var it = message.NewReadCommittedIter(rr, newEvent, message.NewSequencer(nil, nil, 16))
			var lastN = map[string]int{}
			for {
				var env, err = it.Next()
				if errors.Is(err, client.ErrOffsetNotYetAvailable) {
					break
				}
				require.NoError(e, err)
				if message.GetFlags(env.Message.GetUUID()) == message.Flag_ACK_TXN {
					continue
				}
				var ev = env.Message.(*event)
				require.Greater(e, ev.N+1, lastN[ev.Key], "out of order in %s", p.Name)
				lastN[ev.Key] = ev.N + 1
				got = append(got, fmt.Sprint("committed ", ev.N))
			}
			rr.Cancel()
		}
		sort.Strings(want)
		sort.Strings(got)
		require.Equal(e, want, got)
	})
}
