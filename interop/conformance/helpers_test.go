package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
)

// spec is a journal spec with small fragments in the file:// store.
func (e *env) spec(name string, codec pb.CompressionCodec, labels ...string) *pb.JournalSpec {
	return &pb.JournalSpec{
		Name:        pb.Journal(e.prefix + name),
		Replication: 1,
		LabelSet:    pb.MustLabelSet(labels...),
		Fragment: pb.JournalSpec_Fragment{
			Length:           1024,
			CompressionCodec: codec,
			Stores:           []pb.FragmentStore{"file:///"},
			RefreshInterval:  time.Second,
		},
	}
}

// create applies new journals and waits until they are assigned (Gazette assigns them
// asynchronously; pygazette at once).
func (e *env) create(specs ...*pb.JournalSpec) {
	var req = new(pb.ApplyRequest)
	for _, s := range specs {
		req.Changes = append(req.Changes, pb.ApplyRequest_Change{Upsert: s, ExpectModRevision: 0})
	}
	var _, err = client.ApplyJournals(e.ctx, e.rjc, req)
	require.NoError(e, err)

	for {
		var resp, err = client.ListAllJournals(e.ctx, e.rjc, pb.ListRequest{
			Selector: pb.LabelSelector{Include: pb.MustLabelSet("prefix", e.prefix)},
		})
		require.NoError(e, err)
		var assigned = 0
		for _, j := range resp.Journals {
			if j.Route.Primary != -1 {
				assigned++
			}
		}
		if assigned >= len(specs) {
			return
		}
		e.sleep(50 * time.Millisecond)
	}
}

func (e *env) sleep(d time.Duration) {
	select {
	case <-e.ctx.Done():
		e.Fatal(e.ctx.Err())
	case <-time.After(d):
	}
}

// journal names a journal of this test.
func (e *env) journal(name string) pb.Journal { return pb.Journal(e.prefix + name) }

// appendOK appends content with client.Append and returns the commit.
func (e *env) appendOK(req pb.AppendRequest, content ...[]byte) *pb.Fragment {
	var readers []io.ReaderAt
	for _, c := range content {
		readers = append(readers, bytes.NewReader(c))
	}
	var resp, err = client.Append(e.ctx, e.rjc, req, readers...)
	require.NoError(e, err)
	require.Equal(e, pb.Status_OK, resp.Status)
	return resp.Commit
}

// readToHead reads journal from offset through a non-blocking RetryReader, to the write head.
func (e *env) readToHead(journal pb.Journal, offset int64) []byte {
	var rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: journal, Offset: offset})
	defer rr.Cancel()
	var out bytes.Buffer
	var buf = make([]byte, 1<<16)
	for {
		var n, err = rr.Read(buf)
		out.Write(buf[:n])
		if errors.Is(err, client.ErrOffsetNotYetAvailable) {
			return out.Bytes()
		} else if err != nil && !errors.Is(err, client.ErrOffsetJump) {
			e.Fatalf("reading %s: %v", journal, err)
		}
	}
}

// waitPersisted waits until at least n fragments of the journal are persisted.
func (e *env) waitPersisted(journal pb.Journal, n int) []pb.Fragment {
	for {
		var resp, err = client.ListAllFragments(e.ctx, e.rjc, pb.FragmentsRequest{Journal: journal})
		require.NoError(e, err)
		var out []pb.Fragment
		for _, f := range resp.Fragments {
			if f.Spec.BackingStore != "" {
				out = append(out, f.Spec)
			}
		}
		if len(out) >= n {
			return out
		}
		e.sleep(100 * time.Millisecond)
	}
}

// records is deterministic newline-terminated content of about size bytes.
func records(tag string, size int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "%s line %06d %05x\n", tag, i, i*7919%100003)
	}
	return b.Bytes()
}
