package recoverylog

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
	rl "go.gazette.dev/core/consumer/recoverylog"
	mbp "go.gazette.dev/core/mainboilerplate"
)

// pygazette records (several commits: creates, writes at offsets, a sparse file, a large file,
// hard links, a rename, a removal, a property); Gazette's Player plays the log, from empty
// hints and from the hints pygazette's Recorder built, to the same files; both players
// resolve the same hints; and pygazette plays the hints Gazette's Player resolved.
func TestGazettePlaysPygazetteLog(t *testing.T) {
	var e = newEnv(t)
	var log = e.newLog("py-recorded")
	// A recovery log needn't start at offset 0.
	e.appendRaw(log, "content of the journal before the recovery log begins")

	var rec = pyTakeOver(t, rl.FSMHints{Log: log}, e.dir("py"), 4242)
	rec.create("a/one", []byte("hello"))
	rec.write("a/one", 5, []byte(", world"))
	rec.create("big", randomBytes(1, 300_000))
	rec.link("big", "c/big-link")
	rec.property("IDENTITY", "pygazette-db-identity")
	rec.commit()

	rec.create("doomed", []byte("removed before the next commit"))
	rec.rename("a/one", "a/renamed")
	rec.remove("doomed")
	rec.create("sparse", nil)
	rec.write("sparse", 5000, []byte("tail"))
	rec.write("big", 1000, []byte("overwritten by a later commit"))
	rec.commit()

	rec.create("empty", nil)
	rec.commit()
	var hints = rec.hints()
	require.Equal(t, []string{"IDENTITY", "a/renamed", "big", "c/big-link", "empty", "sparse"},
		fileNames(rec.dir))

	// The log spans fragments (which Gazette's Player, reading with DoNotProxy, opens from
	// the store once they are persisted).
	var frags, err = client.ListAllFragments(e.ctx, e.rjc, pb.FragmentsRequest{Journal: log})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(frags.Fragments), 2)

	var goResolved rl.FSMHints
	for _, from := range []rl.FSMHints{{Log: log}, hints} {
		var dir = e.dir("go-played")
		goResolved = e.goPlay(from, dir, 0).Resolved.FSM.BuildHints(log)
		requireSameFiles(t, rec.dir, dir)
	}
	// Gazette's Player resolves the live files and properties the Recorder hinted.
	require.Equal(t, fnodes(hints), fnodes(goResolved))
	require.Equal(t, properties(hints), properties(goResolved))

	// pygazette's Player, playing the same hints, resolves exactly the same hints.
	var pyDir = e.dir("py-played")
	var pyResolved = pyPlay(t, hints, pyDir)
	requireSameFiles(t, rec.dir, pyDir)
	require.Equal(t, normalized(goResolved), normalized(pyResolved))

	// And it plays the hints Gazette's Player resolved.
	pyDir = e.dir("py-played-go-hints")
	pyPlay(t, goResolved, pyDir)
	requireSameFiles(t, rec.dir, pyDir)
}

// Gazette's Player hands off a log pygazette records (InjectHandoff): pygazette's Recorder is
// fenced, and nothing it records afterwards lands; Gazette's Recorder, the new author,
// records on; pygazette's Player plays the result.
func TestGazetteHandoffFencesPygazetteRecorder(t *testing.T) {
	var e = newEnv(t)
	var log = e.newLog("handed-off")

	var rec = pyTakeOver(t, rl.FSMHints{Log: log}, e.dir("py"), 4242)
	rec.create("kept", []byte("committed before the hand-off"))
	rec.create("also-kept", []byte("also committed"))
	rec.commit()
	var pyHints = rec.hints()

	var goDir = e.dir("go-took-over")
	var player = e.goPlay(pyHints, goDir, 777)
	requireSameFiles(t, rec.dir, goDir)
	require.Equal(t, []string{"also-kept", "kept"}, fileNames(goDir))

	rec.create("zombie", []byte("recorded after the hand-off"))
	var r = py.call(t, command{Cmd: "commit", Rec: rec.name})
	require.True(t, r.Fenced, "pygazette's recorder was not fenced: %+v", r)
	// A fenced recorder stays fenced.
	r = py.call(t, command{Cmd: "commit", Rec: rec.name})
	require.True(t, r.Fenced, "%+v", r)

	var gorec = newGoRecorder(e, log, player, 777)
	gorec.create("from-gazette", []byte("recorded by Gazette after the hand-off"))
	gorec.write("kept", 0, []byte("KEPT"))
	gorec.rename("also-kept", "renamed-by-gazette")
	var goHints = gorec.hints()
	require.Equal(t, []string{"from-gazette", "kept", "renamed-by-gazette"}, fileNames(goDir))

	for _, from := range []rl.FSMHints{{Log: log}, pyHints, goHints} {
		var dir = e.dir("py-played")
		pyPlay(t, from, dir)
		requireSameFiles(t, goDir, dir)
	}
	// Gazette's Player agrees: the zombie never landed.
	var dir = e.dir("go-played")
	e.goPlay(rl.FSMHints{Log: log}, dir, 0)
	requireSameFiles(t, goDir, dir)
}

// Gazette records; pygazette plays the log to the same files (from empty hints and from
// Gazette's hints), resolving the hints Gazette's Player resolves; pygazette takes the log
// over (fencing it to its author) and records on; Gazette plays the result.
func TestPygazettePlaysGazetteLog(t *testing.T) {
	var e = newEnv(t)
	// No content precedes this log: Gazette's Player, reading a log whose last bytes are
	// not a whole frame (here: only foreign content), waits at them for more content even
	// when asked to hand off, so it couldn't start recording it. (pygazette's Player takes
	// such a log over: see TestGazettePlaysPygazetteLog.)
	var log = e.newLog("go-recorded")

	var goDir = e.dir("go")
	var gorec = newGoRecorder(e, log, e.goPlay(rl.FSMHints{Log: log}, goDir, 999), 999)
	gorec.create("a/one", []byte("hello from gazette"))
	gorec.create("tmp", []byte("soon renamed"))
	gorec.rename("tmp", "b/renamed")
	gorec.create("doomed", []byte("gone"))
	gorec.remove("doomed")
	gorec.link("a/one", "a/linked")
	gorec.create("big", randomBytes(2, 200_000))
	gorec.write("big", 150_000, []byte("overwritten"))
	gorec.create("sparse", nil)
	gorec.write("sparse", 3000, []byte("tail"))
	// As RocksDB writes its IDENTITY: a temporary file renamed onto the property path.
	gorec.create("tmp-identity", []byte("gazette-db-identity"))
	gorec.rename("tmp-identity", "IDENTITY")
	var goHints = gorec.hints()
	require.Equal(t, []string{"IDENTITY", "a/linked", "a/one", "b/renamed", "big", "sparse"},
		fileNames(goDir))

	for _, from := range []rl.FSMHints{{Log: log}, goHints} {
		var dir = e.dir("py-played")
		var pyResolved = pyPlay(t, from, dir)
		requireSameFiles(t, goDir, dir)

		var goResolved = e.goPlay(from, e.dir("go-played"), 0).Resolved.FSM.BuildHints(log)
		require.Equal(t, normalized(goResolved), normalized(pyResolved))
	}

	// pygazette takes the log over and records on: a write through one of two hard links,
	// a new file, and a removal.
	var rec = pyTakeOver(t, goHints, e.dir("py-took-over"), 1000)
	rec.write("a/linked", 0, []byte("HELLO"))
	rec.create("added-by-pygazette", []byte("!"))
	rec.remove("b/renamed")
	rec.commit()
	var pyHints = rec.hints()
	require.Equal(t, []string{"IDENTITY", "a/linked", "a/one", "added-by-pygazette", "big", "sparse"},
		fileNames(rec.dir))
	require.Equal(t, "HELLO from gazette", readFile(t, rec.dir, "a/one"))

	for _, from := range []rl.FSMHints{{Log: log}, goHints, pyHints} {
		var dir = e.dir("go-played")
		e.goPlay(from, dir, 0)
		requireSameFiles(t, rec.dir, dir)
	}
}

// env is one test's Gazette client of the broker, and its scratch directory.
type env struct {
	*testing.T
	ctx     context.Context
	rjc     pb.RoutedJournalClient
	ajc     client.AsyncJournalClient
	scratch string
	dirs    int
	run     int // Distinguishes runs of one test (go test -count).
}

var runs int

func newEnv(t *testing.T) *env {
	var ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)

	var cfg = mbp.ClientConfig{AddressConfig: mbp.AddressConfig{Address: broker.Endpoint}}
	cfg.Cache.Size = 64
	cfg.Cache.TTL = time.Minute
	var rjc = cfg.MustRoutedJournalClient(ctx)
	runs++
	return &env{T: t, ctx: ctx, rjc: rjc, ajc: client.NewAppendService(ctx, rjc),
		scratch: t.TempDir(), run: runs}
}

// dir names a new directory of the test (a player makes it).
func (e *env) dir(name string) string {
	e.dirs++
	return filepath.Join(e.scratch, fmt.Sprintf("%02d-%s", e.dirs, name))
}

// newLog creates a recovery log journal with small fragments, so that a log spans several.
func (e *env) newLog(name string) pb.Journal {
	var journal = pb.Journal(fmt.Sprintf("recoverylog/%s/%d/%s", e.Name(), e.run, name))
	var spec = &pb.JournalSpec{
		Name:        journal,
		Replication: 1,
		LabelSet:    pb.MustLabelSet("content-type", "application/x-gazette-recoverylog"),
		Fragment: pb.JournalSpec_Fragment{
			Length:           64 << 10,
			CompressionCodec: pb.CompressionCodec_SNAPPY,
			Stores:           []pb.FragmentStore{"file:///"},
			RefreshInterval:  time.Second,
		},
	}
	var _, err = client.ApplyJournals(e.ctx, e.rjc, &pb.ApplyRequest{
		Changes: []pb.ApplyRequest_Change{{Upsert: spec, ExpectModRevision: 0}},
	})
	require.NoError(e, err)

	for {
		var resp, err = client.ListAllJournals(e.ctx, e.rjc, pb.ListRequest{
			Selector: pb.LabelSelector{Include: pb.MustLabelSet("name", journal.String())},
		})
		require.NoError(e, err)
		if len(resp.Journals) == 1 && resp.Journals[0].Route.Primary != -1 {
			return journal
		}
		select {
		case <-e.ctx.Done():
			e.Fatal(e.ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// appendRaw appends content which isn't a recorded operation.
func (e *env) appendRaw(journal pb.Journal, content string) {
	var resp, err = client.Append(e.ctx, e.rjc, pb.AppendRequest{Journal: journal},
		strings.NewReader(content))
	require.NoError(e, err)
	require.Equal(e, pb.Status_OK, resp.Status)
}

// goPlay plays hints into dir with Gazette's Player: to the write head, or (with a nonzero
// handoff) until it injected a hand-off to that author.
func (e *env) goPlay(hints rl.FSMHints, dir string, handoff rl.Author) *rl.Player {
	e.Helper()
	var player = rl.NewPlayer()
	var done = make(chan error, 1)
	go func() { done <- player.Play(e.ctx, hints, dir, e.ajc) }()
	if handoff != 0 {
		player.InjectHandoff(handoff)
	} else {
		player.FinishAtWriteHead()
	}
	require.NoError(e, <-done, "Gazette's Player, playing %s into %s", hints.Log, dir)
	return player
}

// goRecorder is Gazette's Recorder, with the file operations it records.
type goRecorder struct {
	e   *env
	rec *rl.Recorder
	fsm *rl.FSM
	dir string
}

// newGoRecorder records into log from where player (which handed off to author) finished.
func newGoRecorder(e *env, log pb.Journal, player *rl.Player, author rl.Author) *goRecorder {
	var fsm = player.Resolved.FSM
	return &goRecorder{e: e, fsm: fsm, dir: player.Resolved.Dir,
		rec: rl.NewRecorder(log, fsm, author, player.Resolved.Dir, e.ajc)}
}

func (g *goRecorder) path(rel string) string { return filepath.Join(g.dir, rel) }

func (g *goRecorder) create(rel string, data []byte) {
	require.NoError(g.e, os.MkdirAll(filepath.Dir(g.path(rel)), 0o777))
	require.NoError(g.e, os.WriteFile(g.path(rel), data, 0o666))
	var fnode = g.rec.RecordCreate(g.path(rel))
	if len(data) != 0 {
		g.rec.RecordWriteAt(fnode, data, 0)
	}
}

func (g *goRecorder) write(rel string, offset int64, data []byte) {
	var f, err = os.OpenFile(g.path(rel), os.O_WRONLY, 0)
	require.NoError(g.e, err)
	_, err = f.WriteAt(data, offset)
	require.NoError(g.e, err)
	require.NoError(g.e, f.Close())
	var fnode, ok = g.fsm.Links["/"+rel]
	require.True(g.e, ok, rel)
	g.rec.RecordWriteAt(fnode, data, offset)
}

func (g *goRecorder) link(src, dst string) {
	require.NoError(g.e, os.MkdirAll(filepath.Dir(g.path(dst)), 0o777))
	require.NoError(g.e, os.Link(g.path(src), g.path(dst)))
	g.rec.RecordLink(g.path(src), g.path(dst))
}

func (g *goRecorder) remove(rel string) {
	require.NoError(g.e, os.Remove(g.path(rel)))
	g.rec.RecordRemove(g.path(rel))
}

func (g *goRecorder) rename(src, dst string) {
	require.NoError(g.e, os.MkdirAll(filepath.Dir(g.path(dst)), 0o777))
	require.NoError(g.e, os.Rename(g.path(src), g.path(dst)))
	g.rec.RecordRename(g.path(src), g.path(dst))
}

// hints waits for everything recorded to commit, and returns the Recorder's hints.
func (g *goRecorder) hints() rl.FSMHints {
	var hints, err = g.rec.BuildHints()
	require.NoError(g.e, err)
	return hints
}

// requireSameFiles checks that dir got holds the files of dir want: same paths, same
// contents, and the same paths hard-linked together.
func requireSameFiles(t *testing.T, want, got string) {
	t.Helper()
	require.Equal(t, describeFiles(t, want), describeFiles(t, got), "files of %s vs %s", got, want)
}

// describeFiles describes each file under dir (its content, or size and digest if large) and
// which other paths link it.
func describeFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	var byInode = map[uint64][]string{}
	var out = map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		var rel, _ = filepath.Rel(dir, path)
		var data, err2 = os.ReadFile(path)
		if err2 != nil {
			return err2
		}
		var info, err3 = d.Info()
		if err3 != nil {
			return err3
		}
		var ino = info.Sys().(*syscall.Stat_t).Ino
		byInode[ino] = append(byInode[ino], rel)
		if len(data) <= 64 {
			out[rel] = fmt.Sprintf("%q", data)
		} else {
			out[rel] = fmt.Sprintf("%d bytes, sha256 %x", len(data), sha256.Sum256(data))
		}
		return nil
	}))
	for _, paths := range byInode {
		if len(paths) > 1 {
			sort.Strings(paths)
			for _, p := range paths {
				out[p] += " linked as " + strings.Join(paths, ", ")
			}
		}
	}
	return out
}

func fileNames(dir string) []string {
	var names []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			var rel, _ = filepath.Rel(dir, path)
			names = append(names, rel)
		}
		return err
	})
	sort.Strings(names)
	return names
}

func readFile(t *testing.T, dir, rel string) string {
	var data, err = os.ReadFile(filepath.Join(dir, rel))
	require.NoError(t, err)
	return string(data)
}

func randomBytes(seed int64, n int) []byte {
	var b = make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func fnodes(h rl.FSMHints) []rl.Fnode {
	var out []rl.Fnode
	for _, n := range h.LiveNodes {
		out = append(out, n.Fnode)
	}
	return out
}

func properties(h rl.FSMHints) []rl.Property {
	var out = append([]rl.Property(nil), h.Properties...)
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// normalized orders what hints hold in no particular order (Gazette's properties come from
// a map), so that equal hints compare equal.
func normalized(h rl.FSMHints) rl.FSMHints {
	h.Properties = properties(h)
	if len(h.Properties) == 0 {
		h.Properties = nil
	}
	if len(h.LiveNodes) == 0 {
		h.LiveNodes = nil
	}
	return h
}
