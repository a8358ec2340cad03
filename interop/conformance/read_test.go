package conformance

import (
	"bufio"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
)

func TestReader(t *testing.T) {
	forEachBroker(t, func(e *env) {
		e.create(e.spec("r", pb.CompressionCodec_NONE))
		var j = e.journal("r")
		e.appendOK(pb.AppendRequest{Journal: j}, []byte("0123456789"))
		e.appendOK(pb.AppendRequest{Journal: j}, []byte("abcdef\n"))

		var readAll = func(req pb.ReadRequest) (string, *client.Reader, error) {
			var r = client.NewReader(e.ctx, e.rjc, req)
			var data, err = io.ReadAll(r)
			return string(data), r, err
		}

		// Non-blocking: content to the write head, then OFFSET_NOT_YET_AVAILABLE.
		var data, r, err = readAll(pb.ReadRequest{Journal: j})
		require.Equal(e, client.ErrOffsetNotYetAvailable, err)
		require.Equal(e, "0123456789abcdef\n", data)
		require.Equal(e, int64(17), r.Request.Offset)
		require.Equal(e, int64(17), r.Response.WriteHead)

		// Offsets and end offsets, across the first append's fragment boundary.
		data, r, err = readAll(pb.ReadRequest{Journal: j, Offset: 3, EndOffset: 12})
		require.NoError(e, err)
		require.Equal(e, "3456789ab", data)
		require.Equal(e, int64(12), r.Request.Offset)

		// The write head (-1), and offsets at or past it.
		for _, offset := range []int64{-1, 17, 100} {
			data, r, err = readAll(pb.ReadRequest{Journal: j, Offset: offset})
			require.Equal(e, client.ErrOffsetNotYetAvailable, err, "offset %d", offset)
			require.Empty(e, data)
			require.Equal(e, int64(17), r.Response.WriteHead)
		}

		// Metadata only: the fragment covering the offset, and no content.
		data, r, err = readAll(pb.ReadRequest{Journal: j, Offset: 12, MetadataOnly: true})
		require.NoError(e, err)
		require.Empty(e, data)
		require.Equal(e, int64(10), r.Response.Fragment.Begin)
		require.Equal(e, int64(17), r.Response.Fragment.End)
		require.Equal(e, pb.SHA1SumOf("abcdef\n"), r.Response.Fragment.Sum)

		// Unknown journals and invalid requests.
		_, _, err = readAll(pb.ReadRequest{Journal: e.journal("nope")})
		require.Equal(e, client.ErrJournalNotFound, err)
		_, _, err = readAll(pb.ReadRequest{Journal: j, Offset: -2})
		require.ErrorContains(e, err, "invalid Offset (-2; expected -1 <= Offset <= MaxInt64)")
	})
}

func TestRetryReader(t *testing.T) {
	forEachBroker(t, func(e *env) {
		e.create(e.spec("rr", pb.CompressionCodec_SNAPPY))
		var j = e.journal("rr")
		e.appendOK(pb.AppendRequest{Journal: j}, []byte("first\n"))

		// A blocking read at the write head wakes up on the next append.
		var rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: j, Offset: 6, Block: true})
		var got = make(chan string, 1)
		go func() {
			var line, _ = bufio.NewReader(rr).ReadString('\n')
			got <- line
		}()
		e.sleep(200 * time.Millisecond)
		e.appendOK(pb.AppendRequest{Journal: j}, []byte("second\n"))
		select {
		case line := <-got:
			require.Equal(e, "second\n", line)
		case <-time.After(30 * time.Second):
			e.Fatal("blocking read never woke up")
		}
		require.Equal(e, int64(13), rr.Offset())
		rr.Cancel()

		// Offset -1 blocks for content appended after the read starts. The client reports
		// the resolution of -1 to the write head as an offset jump.
		rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: j, Offset: -1, Block: true})
		go func() {
			var buf = make([]byte, 64)
			for {
				var n, err = rr.Read(buf)
				if n == 0 && (err == nil || errors.Is(err, client.ErrOffsetJump)) {
					continue // Metadata, or the jump to the write head.
				}
				got <- string(buf[:n])
				return
			}
		}()
		e.sleep(200 * time.Millisecond)
		e.appendOK(pb.AppendRequest{Journal: j}, []byte("third\n"))
		select {
		case line := <-got:
			require.Equal(e, "third\n", line)
		case <-time.After(30 * time.Second):
			e.Fatal("blocking read at -1 never woke up")
		}
		rr.Cancel()

		// An end offset ends the read with EOF, even a blocking one.
		rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: j, Offset: 2, EndOffset: 9, Block: true})
		var data, err = io.ReadAll(rr)
		require.NoError(e, err)
		require.Equal(e, "rst\nsec", string(data))

		// Non-blocking reads surface OFFSET_NOT_YET_AVAILABLE at the head.
		rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: j, Offset: 0})
		data, err = io.ReadAll(rr)
		require.True(e, errors.Is(err, client.ErrOffsetNotYetAvailable), "%v", err)
		require.Equal(e, "first\nsecond\nthird\n", string(data))

		// Seek within the journal.
		rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: j, Offset: 0})
		var offset, err2 = rr.Seek(6, io.SeekStart)
		require.NoError(e, err2)
		require.Equal(e, int64(6), offset)
		var line, _ = bufio.NewReader(rr).ReadString('\n')
		require.Equal(e, "second\n", line)
		rr.Cancel()
	})
}
