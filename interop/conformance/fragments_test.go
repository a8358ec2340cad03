package conformance

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
)

func TestFragments(t *testing.T) {
	forEachBroker(t, func(e *env) {
		var codecs = []pb.CompressionCodec{
			pb.CompressionCodec_NONE, pb.CompressionCodec_SNAPPY, pb.CompressionCodec_GZIP,
		}
		for _, codec := range codecs {
			var spec = e.spec("f-"+codec.String(), codec)
			e.create(spec)
			var j = spec.Name

			// Appends of 300 to 2000 bytes: a fragment rolls after the first append, and
			// whenever one holds more than 1024 bytes.
			var content []byte
			for i, size := range []int{300, 2000, 700, 600, 1500, 100} {
				var data = records(j.String()+string(rune('a'+i)), size)
				e.appendOK(pb.AppendRequest{Journal: j}, data)
				content = append(content, data...)
			}
			var persisted = e.waitPersisted(j, 4)

			var all, err = client.ListAllFragments(e.ctx, e.rjc, pb.FragmentsRequest{
				Journal:      j,
				SignatureTTL: durationPtr(time.Minute),
			})
			require.NoError(e, err)
			require.Equal(e, int64(0), all.Fragments[0].Spec.Begin)
			require.Equal(e, int64(len(content)), all.Fragments[len(all.Fragments)-1].Spec.End)
			for i, f := range all.Fragments {
				if i > 0 {
					require.Equal(e, all.Fragments[i-1].Spec.End, f.Spec.Begin)
				}
				require.Equal(e, codec, f.Spec.CompressionCodec)
				require.Equal(e, pb.SHA1SumOf(string(content[f.Spec.Begin:f.Spec.End])), f.Spec.Sum)
			}
			// Paging returns the same fragments.
			paged, err := client.ListAllFragments(e.ctx, e.rjc, pb.FragmentsRequest{Journal: j, PageLimit: 1})
			require.NoError(e, err)
			require.Equal(e, len(all.Fragments), len(paged.Fragments))

			// Every persisted fragment opens directly: by signed URL (relative to the file
			// root, as Gazette's file store signs them), and as a file of the store.
			var remove = client.InstallFileTransport(e.broker.FileRoot)
			for i, f := range all.Fragments[:len(persisted)] {
				require.Equal(e, pb.FragmentStore("file:///"), f.Spec.BackingStore)
				require.Equal(e, "file:///"+f.Spec.ContentPath(), f.SignedUrl)
				var want = content[f.Spec.Begin:f.Spec.End]

				var fr, err = client.OpenFragmentURL(e.ctx, f.Spec, f.Spec.Begin, f.SignedUrl)
				require.NoError(e, err)
				got, err := io.ReadAll(fr)
				require.NoError(e, err)
				require.Equal(e, want, got, "fragment %d via URL", i)

				file, err := os.Open(filepath.Join(e.broker.FileRoot, f.Spec.ContentPath()))
				require.NoError(e, err)
				var mid = f.Spec.Begin + (f.Spec.End-f.Spec.Begin)/2
				fr, err = client.NewFragmentReader(file, f.Spec, mid)
				require.NoError(e, err)
				got, err = io.ReadAll(fr)
				require.NoError(e, err)
				require.Equal(e, content[mid:f.Spec.End], got, "fragment %d from the file", i)
				require.NoError(e, fr.Close())
			}

			// Reads that don't proxy open persisted fragments themselves, then continue
			// through the broker where the journal is still spooled.
			var rr = client.NewRetryReader(e.ctx, e.rjc, pb.ReadRequest{Journal: j, Offset: 5, DoNotProxy: true})
			var got bytes.Buffer
			var buf = make([]byte, 4096)
			var direct = false
			for {
				var n, err = rr.Read(buf)
				got.Write(buf[:n])
				direct = direct || rr.Reader.Response.FragmentUrl != ""
				if errors.Is(err, client.ErrOffsetNotYetAvailable) {
					break
				}
				require.NoError(e, err)
			}
			require.True(e, direct)
			require.Equal(e, content[5:], got.Bytes())
			remove()

			// Proxied reads serve the same bytes.
			require.Equal(e, content, e.readToHead(j, 0))
		}

		// An unknown journal.
		_, err := client.ListAllFragments(e.ctx, e.rjc, pb.FragmentsRequest{Journal: e.journal("nope")})
		require.EqualError(e, err, pb.Status_JOURNAL_NOT_FOUND.String())
	})
}

func durationPtr(d time.Duration) *time.Duration { return &d }
