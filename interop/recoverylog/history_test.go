package recoverylog

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
	rl "go.gazette.dev/core/consumer/recoverylog"
)

// A longer history written by Gazette's Recorders, as a shard's successive primaries write
// it: a property changed (IDENTITY renamed onto twice), a file renamed over another while a
// hard link keeps the replaced one alive, that link removed later, and a hand-off to a
// second Gazette author. pygazette's Player plays it from empty hints, from hints of the
// first primary taken at two points (older primaries' hints) and from the second's, to the
// files and resolved hints Gazette's Player gives. Then the fragments no hinted segment of
// the newest hints overlaps are removed from the store (as `shards prune` does): both
// Players still play the newest hints to the same files, and both refuse the first hints.
func TestPygazettePlaysGazetteHistory(t *testing.T) {
	var e = newEnv(t)
	var log = e.newLog("go-history")

	var dirA = e.dir("go-a")
	var a = newGoRecorder(e, log, e.goPlay(rl.FSMHints{Log: log}, dirA, 11), 11)
	a.create("db/a", randomBytes(10, 100_000))
	a.create("tmp-identity", []byte("identity-1"))
	a.rename("tmp-identity", "IDENTITY")
	a.link("db/a", "db/a-link")
	var hintsA1 = a.hints()

	a.create("db/b", randomBytes(11, 150_000))
	a.rename("db/b", "db/a") // db/a-link keeps the replaced file alive.
	a.create("tmp-identity", []byte("identity-2"))
	a.rename("tmp-identity", "IDENTITY") // The property changes.
	a.write("db/a", 10, []byte("XYZ"))
	a.remove("db/a-link") // The replaced file is gone now.
	a.create("db/old", randomBytes(12, 80_000))
	var hintsA2 = a.hints()

	var dirB = e.dir("go-b")
	var b = newGoRecorder(e, log, e.goPlay(hintsA2, dirB, 22), 22)
	b.create("db/c", randomBytes(13, 70_000))
	b.rename("db/c", "db/d")
	b.remove("db/old")
	b.write("db/a", 0, []byte("from the second primary"))
	var hintsB = b.hints()
	require.Equal(t, []string{"IDENTITY", "db/a", "db/d"}, fileNames(dirB))
	require.Equal(t, "identity-2", readFile(t, dirB, "IDENTITY"))

	for _, from := range []rl.FSMHints{{Log: log}, hintsA1, hintsA2, hintsB} {
		var goDir = e.dir("go-played")
		var goResolved = e.goPlay(from, goDir, 0).Resolved.FSM.BuildHints(log)
		requireSameFiles(t, dirB, goDir)

		var pyDir = e.dir("py-played")
		var pyResolved = pyPlay(t, from, pyDir)
		requireSameFiles(t, dirB, pyDir)
		require.Equal(t, normalized(goResolved), normalized(pyResolved))
	}

	// Remove the persisted fragments the newest hints don't need, from the log's beginning
	// (the last, still in the broker's spool, always overlaps the last hinted segment).
	var _, segments, err = hintsB.LiveLogSegments()
	require.NoError(t, err)
	segments[len(segments)-1].LastOffset = 0
	var frags []pb.FragmentsResponse__Fragment
	var prunable []pb.Fragment
	for len(prunable) == 0 {
		var resp, err = client.ListAllFragments(e.ctx, e.rjc, pb.FragmentsRequest{Journal: log})
		require.NoError(t, err)
		frags = resp.Fragments
		for _, f := range frags {
			var overlaps = false
			for _, s := range segments {
				if s.FirstOffset < f.Spec.End && (s.LastOffset > f.Spec.Begin || s.LastOffset == 0) {
					overlaps = true
				}
			}
			// A prefix of the log only: a broker skips a gap in the middle of a journal
			// only once the fragment after it is six hours old (both brokers do), and
			// readers of the gap wait till then.
			if overlaps || f.Spec.ModTime == 0 {
				break
			}
			prunable = append(prunable, f.Spec)
		}
		if len(prunable) == 0 {
			select {
			case <-e.ctx.Done():
				t.Fatalf("no fragment to remove: %v vs %v", frags, segments)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	var removed = 0
	for _, f := range prunable {
		var path = filepath.Join(broker.FileRoot, f.ContentPath())
		require.NoError(t, os.Remove(path), "removing %s", path)
		removed++
	}
	require.NotZero(t, removed, "no fragment to remove: %v vs %v", frags, segments)
	// Wait for the broker's index to drop them (refresh interval 1s).
	for {
		var resp, err = client.ListAllFragments(e.ctx, e.rjc, pb.FragmentsRequest{Journal: log})
		require.NoError(t, err)
		if len(resp.Fragments) == len(frags)-removed {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	var goDir = e.dir("go-played-pruned")
	var goResolved = e.goPlay(hintsB, goDir, 0).Resolved.FSM.BuildHints(log)
	requireSameFiles(t, dirB, goDir)
	var pyDir = e.dir("py-played-pruned")
	var pyResolved = pyPlay(t, hintsB, pyDir)
	requireSameFiles(t, dirB, pyDir)
	require.Equal(t, normalized(goResolved), normalized(pyResolved))

	// Without hints, a Player replays the log from its first operation on, and some are
	// gone now: Gazette's Player completes anyway, with the files as of before the gap (none
	// of the operations after it apply); pygazette's refuses (a deliberate difference).
	var goEmptyDir = e.dir("go-played-unhinted")
	e.goPlay(rl.FSMHints{Log: log}, goEmptyDir, 0)
	require.NotEqual(t, fileNames(dirB), fileNames(goEmptyDir))
	var unhinted = rl.FSMHints{Log: log}
	r := py.call(t, command{Cmd: "play", Hints: &unhinted, Dir: e.dir("py-played-unhinted")})
	require.False(t, r.OK, "pygazette played a log whose beginning is gone without hints")
	require.Contains(t, r.Error, "there are no hints to start from")
	t.Logf("pygazette, without hints: %s", r.Error)

	// A third primary forks the history into a new log (as a shard moved to a new recovery
	// log): its hints name segments of both logs, which both Players play.
	var log2 = e.newLog("go-history-fork")
	var dirC = e.dir("go-c")
	var forkPlayer = e.goPlay(hintsB, dirC, 33)
	var c = &goRecorder{e: e, fsm: forkPlayer.Resolved.FSM, dir: dirC,
		rec: rl.NewRecorder(log2, forkPlayer.Resolved.FSM, 33, dirC, e.ajc)}
	c.create("db/e", randomBytes(14, 90_000))
	c.write("db/d", 5, []byte("forked"))
	c.rename("db/e", "db/a") // Replaces a file of the first log.
	var hintsC = c.hints()
	require.Equal(t, log2, hintsC.Log)
	for _, from := range []rl.FSMHints{hintsC} {
		var goDir = e.dir("go-played-fork")
		var goResolved = e.goPlay(from, goDir, 0).Resolved.FSM.BuildHints(log2)
		requireSameFiles(t, dirC, goDir)
		var pyDir = e.dir("py-played-fork")
		var pyResolved = pyPlay(t, from, pyDir)
		requireSameFiles(t, dirC, pyDir)
		require.Equal(t, normalized(goResolved), normalized(pyResolved))
	}

	// The first hints need removed fragments: both Players refuse them.
	r = py.call(t, command{Cmd: "play", Hints: &hintsA1, Dir: e.dir("py-played-a1")})
	require.False(t, r.OK, "pygazette played hints whose fragments are gone")
	t.Logf("pygazette: %s", r.Error)
	var player = rl.NewPlayer()
	var done = make(chan error, 1)
	go func() { done <- player.Play(e.ctx, hintsA1, e.dir("go-played-a1"), e.ajc) }()
	player.FinishAtWriteHead()
	var goErr = <-done
	require.Error(t, goErr, "Gazette played hints whose fragments are gone")
	t.Logf("gazette: %s", goErr)
}
