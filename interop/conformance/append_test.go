package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
)

func TestAppender(t *testing.T) {
	forEachBroker(t, func(e *env) {
		e.create(e.spec("log", pb.CompressionCodec_SNAPPY))
		var j = e.journal("log")

		// One atomic append over several writes.
		var a = client.NewAppender(e.ctx, e.rjc, pb.AppendRequest{Journal: j})
		for _, part := range []string{"hello", ", ", "world\n"} {
			var _, err = a.Write([]byte(part))
			require.NoError(e, err)
		}
		require.NoError(e, a.Close())
		require.Equal(e, int64(0), a.Response.Commit.Begin)
		require.Equal(e, int64(13), a.Response.Commit.End)
		require.Equal(e, pb.SHA1SumOf("hello, world\n"), a.Response.Commit.Sum)
		require.Equal(e, pb.CompressionCodec_SNAPPY, a.Response.Commit.CompressionCodec)
		require.Equal(e, int64(4), a.Response.TotalChunks) // Three writes and the commit.
		require.Equal(e, e.broker.Endpoint, a.Response.Header.Route.Endpoints[0])

		// An aborted append leaves nothing behind.
		a = client.NewAppender(e.ctx, e.rjc, pb.AppendRequest{Journal: j})
		var _, err = a.Write([]byte("never visible"))
		require.NoError(e, err)
		a.Abort()

		// Offsets: the write head is required when given.
		var commit = e.appendOK(pb.AppendRequest{Journal: j, Offset: 13}, []byte("second\n"))
		require.Equal(e, int64(20), commit.End)
		_, err = client.Append(e.ctx, e.rjc, pb.AppendRequest{Journal: j, Offset: 5},
			bytes.NewReader([]byte("nope")))
		require.Equal(e, client.ErrWrongAppendOffset, err)

		// Registers: a check passes while none are set, then guards the journal.
		e.appendOK(pb.AppendRequest{
			Journal:        j,
			CheckRegisters: &pb.LabelSelector{Include: pb.MustLabelSet("owner", "bob")},
			UnionRegisters: &pb.LabelSet{Labels: []pb.Label{{Name: "owner", Value: "alice"}}},
		}, []byte("claimed\n"))
		var resp, err2 = client.Append(e.ctx, e.rjc, pb.AppendRequest{
			Journal:        j,
			CheckRegisters: &pb.LabelSelector{Include: pb.MustLabelSet("owner", "bob")},
		}, bytes.NewReader([]byte("refused\n")))
		require.True(e, errors.Is(err2, client.ErrRegisterMismatch), "%v", err2)
		require.Equal(e, pb.MustLabelSet("owner", "alice"), *resp.Registers)
		commit = e.appendOK(pb.AppendRequest{
			Journal:           j,
			CheckRegisters:    &pb.LabelSelector{Include: pb.MustLabelSet("owner", "alice")},
			SubtractRegisters: &pb.LabelSet{Labels: []pb.Label{{Name: "owner", Value: "alice"}}},
		}, []byte("released\n"))
		require.Equal(e, int64(37), commit.End)

		// Unknown and read-only journals.
		_, err = client.Append(e.ctx, e.rjc, pb.AppendRequest{Journal: e.journal("nope")},
			bytes.NewReader([]byte("x")))
		require.Equal(e, client.ErrJournalNotFound, err)
		var ro = e.spec("read-only", pb.CompressionCodec_NONE)
		ro.Flags = pb.JournalSpec_O_RDONLY
		e.create(ro)
		_, err = client.Append(e.ctx, e.rjc, pb.AppendRequest{Journal: ro.Name},
			bytes.NewReader([]byte("x")))
		require.Equal(e, client.ErrNotAllowed, err)

		require.Equal(e, "hello, world\nsecond\nclaimed\nreleased\n", string(e.readToHead(j, 0)))
	})
}

func TestAppendService(t *testing.T) {
	forEachBroker(t, func(e *env) {
		var journals = []pb.Journal{e.journal("as-0"), e.journal("as-1"), e.journal("as-2")}
		e.create(
			e.spec("as-0", pb.CompressionCodec_NONE),
			e.spec("as-1", pb.CompressionCodec_SNAPPY),
			e.spec("as-2", pb.CompressionCodec_GZIP),
		)
		var svc = client.NewAppendService(e.ctx, e.rjc)

		// Many writers, small records: the service batches them into few appends, keeping
		// each journal's records in the order they were released.
		const writers, perWriter = 4, 250
		var wg sync.WaitGroup
		var mu sync.Mutex
		var last []*client.AsyncAppend
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < perWriter; i++ {
					var j = journals[(w+i)%len(journals)]
					var aa = svc.StartAppend(pb.AppendRequest{Journal: j}, nil)
					_, _ = fmt.Fprintf(aa.Writer(), "writer %d record %04d\n", w, i)
					require.NoError(e, aa.Release())
					if i == perWriter-1 {
						mu.Lock()
						last = append(last, aa)
						mu.Unlock()
					}
				}
			}(w)
		}
		wg.Wait()
		for _, aa := range last {
			<-aa.Done()
			require.NoError(e, aa.Err())
		}
		// Every journal's appends finished: the last of each writer's is done, and appends
		// to one journal complete in order.
		for _, j := range journals {
			var aa = svc.StartAppend(pb.AppendRequest{Journal: j}, nil)
			require.NoError(e, aa.Release())
			<-aa.Done()
		}

		var total = 0
		for _, j := range journals {
			var lines = bytes.Split(bytes.TrimSuffix(e.readToHead(j, 0), []byte("\n")), []byte("\n"))
			var next = make(map[string]int)
			for _, line := range lines {
				var w, i int
				var _, err = fmt.Sscanf(string(line), "writer %d record %d", &w, &i)
				require.NoError(e, err, "%q", line)
				var key = fmt.Sprint(w)
				require.Greater(e, i+1, next[key], "writer %d out of order in %s", w, j)
				next[key] = i + 1
			}
			total += len(lines)
		}
		require.Equal(e, writers*perWriter, total)
	})
}
