package conformance

import (
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
)

func TestApplyAndListJournals(t *testing.T) {
	forEachBroker(t, func(e *env) {
		var a = e.spec("a", pb.CompressionCodec_NONE, "topic", "clicks", "region", "eu")
		var b = e.spec("b", pb.CompressionCodec_SNAPPY, "topic", "clicks", "region", "us")
		var c = e.spec("c", pb.CompressionCodec_GZIP, "topic", "logs")
		e.create(a, b, c)

		var names = func(selector string) []string {
			var sel, err = pb.ParseLabelSelector(selector)
			require.NoError(e, err)
			resp, err := client.ListAllJournals(e.ctx, e.rjc, pb.ListRequest{Selector: sel})
			require.NoError(e, err)
			var out = []string{}
			for _, j := range resp.Journals {
				require.Equal(e, int32(0), j.Route.Primary)
				require.Len(e, j.Route.Endpoints, 1)
				require.True(e, j.ModRevision > 0 && j.CreateRevision > 0)
				out = append(out, j.Spec.Name.String())
			}
			require.True(e, sort.StringsAreSorted(out))
			return out
		}
		var p = e.prefix
		require.Equal(e, []string{p + "a", p + "b", p + "c"}, names("prefix="+p))
		require.Equal(e, []string{p + "a", p + "b"}, names("prefix="+p+",topic=clicks"))
		require.Equal(e, []string{p + "a", p + "c"}, names("prefix="+p+",region!=us"))
		require.Equal(e, []string{p + "c"}, names("prefix="+p+",!region"))
		require.Equal(e, []string{p + "b", p + "c"}, names("name in ("+p+"b, "+p+"c)"))
		require.Equal(e, []string{p + "c"}, names("prefix="+p+",topic in (logs, x), region notin (us)"))
		require.Equal(e, []string{}, names("name="+p+"nope"))

		// The spec reads back as applied.
		var got, err = client.GetJournal(e.ctx, e.rjc, a.Name)
		require.NoError(e, err)
		require.Equal(e, *a, *got)

		// Revisions are checked: a stale one fails the whole request.
		listing, err := client.ListAllJournals(e.ctx, e.rjc, pb.ListRequest{
			Selector: pb.LabelSelector{Include: pb.MustLabelSet("name", a.Name.String())},
		})
		require.NoError(e, err)
		var updated = *a
		updated.LabelSet = pb.MustLabelSet("topic", "updated")
		_, err = client.ApplyJournals(e.ctx, e.rjc, &pb.ApplyRequest{Changes: []pb.ApplyRequest_Change{
			{Upsert: &updated, ExpectModRevision: listing.Journals[0].ModRevision + 1000},
		}})
		require.EqualError(e, err, pb.Status_ETCD_TRANSACTION_FAILED.String())
		_, err = client.ApplyJournals(e.ctx, e.rjc, &pb.ApplyRequest{Changes: []pb.ApplyRequest_Change{
			{Upsert: &updated, ExpectModRevision: listing.Journals[0].ModRevision},
			{Delete: c.Name, ExpectModRevision: -1},
		}})
		require.NoError(e, err)
		require.Equal(e, []string{p + "a"}, names("prefix="+p+",topic=updated"))
		require.Equal(e, []string{p + "a", p + "b"}, names("prefix="+p))

		// Invalid specs are refused before anything is applied.
		var bad = *b
		bad.Name = pb.Journal(p + "bad name")
		_, err = client.ApplyJournals(e.ctx, e.rjc, &pb.ApplyRequest{Changes: []pb.ApplyRequest_Change{
			{Upsert: &bad, ExpectModRevision: 0},
		}})
		require.ErrorContains(e, err, "Changes[0].Upsert.Name: not a valid token")
	})
}

func TestWatchedList(t *testing.T) {
	forEachBroker(t, func(e *env) {
		var sel, err = pb.ParseLabelSelector("prefix=" + e.prefix)
		require.NoError(e, err)
		var updates = make(chan error, 16)
		var wl = client.NewWatchedList(e.ctx, e.rjc, pb.ListRequest{Selector: sel}, updates)

		require.NoError(e, <-updates)
		require.Empty(e, wl.List().Journals)

		// A new snapshot follows each change of the listed specs (not of their routes).
		e.create(e.spec("w1", pb.CompressionCodec_NONE), e.spec("w2", pb.CompressionCodec_NONE))
		var deadline = time.After(30 * time.Second)
		for len(wl.List().Journals) != 2 {
			select {
			case err := <-updates:
				require.NoError(e, err)
			case <-deadline:
				e.Fatalf("watch never saw both journals: %v", wl.List())
			}
		}
		require.Equal(e, e.journal("w1"), wl.List().Journals[0].Spec.Name)
		require.Equal(e, e.journal("w2"), wl.List().Journals[1].Spec.Name)

		// A deletion is a change too.
		var _, err2 = client.ApplyJournals(e.ctx, e.rjc, &pb.ApplyRequest{Changes: []pb.ApplyRequest_Change{
			{Delete: e.journal("w1"), ExpectModRevision: -1},
		}})
		require.NoError(e, err2)
		for len(wl.List().Journals) != 1 {
			select {
			case err := <-updates:
				require.NoError(e, err)
			case <-deadline:
				e.Fatalf("watch never saw the deletion: %v", wl.List())
			}
		}
		require.Equal(e, e.journal("w2"), wl.List().Journals[0].Spec.Name)
	})
}
