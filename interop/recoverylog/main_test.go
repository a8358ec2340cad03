// Package recoverylog checks pygazette's recovery logs (pygazette/consumer/recoverylog)
// against Gazette's own go.gazette.dev/core/consumer/recoverylog, in both directions, on one
// log journal of a pygazette broker: Gazette's Player plays what pygazette's Recorder wrote,
// pygazette's Player plays what Gazette's Recorder wrote, each hands off the other's log
// (fencing the other's recorder) and records on, and both players resolve the same hints.
//
// Gazette's side runs in this test process. pygazette's side runs in driver.py, one Python
// process for the package, which the tests command over its stdin and stdout (one JSON
// object a line) with the Python of the virtualenv holding $PYGAZETTE.
package recoverylog

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
	rl "go.gazette.dev/core/consumer/recoverylog"
	"pygazette.dev/interop/harness"
)

var (
	broker *harness.Broker
	py     *driver
)

func TestMain(m *testing.M) {
	// Gazette's clients dial the endpoints of journal routes through this dispatcher.
	pb.RegisterGRPCDispatcher("local")

	var scratch, err = os.MkdirTemp("", "pygazette-recoverylog-")
	if err != nil {
		panic(err)
	}
	var code = 1
	if broker, err = harness.Start("pygazette", filepath.Join(scratch, "broker")); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else if py, err = startDriver(broker.Endpoint, filepath.Join(scratch, "driver.log")); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		// Gazette's Player reads with DoNotProxy, opening persisted fragments by their
		// signed URLs (as Gazette's file store signs them: file:///<path under the root>).
		var remove = client.InstallFileTransport(broker.FileRoot)
		code = m.Run()
		remove()
	}
	if code != 0 {
		if broker != nil {
			fmt.Fprintf(os.Stderr, "=== broker logs\n%s", broker.Logs())
		}
		if py != nil {
			fmt.Fprintf(os.Stderr, "=== driver.py stderr\n%s\n", py.logTail())
		}
	}
	if py != nil {
		py.stop()
	}
	if broker != nil {
		broker.Stop()
	}
	_ = os.RemoveAll(scratch)
	os.Exit(code)
}

// pythonExe is the Python of the virtualenv whose bin/ holds $PYGAZETTE (the pygazette
// CLI the harness runs), or of the repository's .venv.
func pythonExe() string {
	var bin = filepath.Join(harness.RepoRoot(), ".venv", "bin")
	if exe := os.Getenv("PYGAZETTE"); exe != "" {
		bin = filepath.Dir(exe)
	}
	return filepath.Join(bin, "python")
}

// driver is the driver.py process: pygazette's recorders and players.
type driver struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan string
	logPath string
	mu      sync.Mutex
}

func startDriver(endpoint pb.Endpoint, logPath string) (*driver, error) {
	var script, err = filepath.Abs("driver.py")
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()

	var d = &driver{logPath: logPath, replies: make(chan string)}
	d.cmd = exec.Command(pythonExe(), script, string(endpoint))
	d.cmd.Stderr = logFile
	d.cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	// Should the test binary die without stopping the driver, it dies with it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if d.stdin, err = d.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err = d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", d.cmd.Path, err)
	}
	go func() {
		var scanner = bufio.NewScanner(stdout)
		scanner.Buffer(nil, 64<<20)
		for scanner.Scan() {
			d.replies <- scanner.Text()
		}
		close(d.replies)
	}()
	return d, nil
}

// command is one command to driver.py (see its docstring).
type command struct {
	Cmd     string       `json:"cmd"`
	Rec     string       `json:"rec,omitempty"`
	Hints   *rl.FSMHints `json:"hints,omitempty"`
	Dir     string       `json:"dir,omitempty"`
	Author  rl.Author    `json:"author,omitempty"`
	Path    string       `json:"path,omitempty"`
	Src     string       `json:"src,omitempty"`
	Dst     string       `json:"dst,omitempty"`
	Content string       `json:"content,omitempty"`
	Offset  int64        `json:"offset,omitempty"`
	Data    []byte       `json:"data,omitempty"`
}

type reply struct {
	OK     bool         `json:"ok"`
	Fenced bool         `json:"fenced"`
	Error  string       `json:"error"`
	Hints  *rl.FSMHints `json:"hints"`
	End    int64        `json:"end"`
}

const driverTimeout = time.Minute

// call sends cmd and returns the driver's reply, which may be a failure.
func (d *driver) call(t *testing.T, cmd command) reply {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()

	var line, err = json.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = d.stdin.Write(append(line, '\n')); err != nil {
		t.Fatalf("driver.py %s: %v\n%s", cmd.Cmd, err, d.logTail())
	}
	select {
	case out, ok := <-d.replies:
		if !ok {
			t.Fatalf("driver.py exited during %s\n%s", cmd.Cmd, d.logTail())
		}
		var r reply
		if err = json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("driver.py %s: bad reply %q: %v", cmd.Cmd, out, err)
		}
		return r
	case <-time.After(driverTimeout):
		_ = d.cmd.Process.Kill() // Later calls fail at once, rather than read this reply.
		t.Fatalf("driver.py %s: no reply after %s\n%s", cmd.Cmd, driverTimeout, d.logTail())
	}
	panic("unreachable")
}

// do sends cmd and fails the test unless the driver succeeded.
func (d *driver) do(t *testing.T, cmd command) reply {
	t.Helper()
	var r = d.call(t, cmd)
	if !r.OK {
		t.Fatalf("pygazette %s %s: %s\n%s", cmd.Cmd, cmd.Path, r.Error, d.logTail())
	}
	return r
}

func (d *driver) logTail() string {
	var data, _ = os.ReadFile(d.logPath)
	if len(data) > 6000 {
		data = data[len(data)-6000:]
	}
	return strings.TrimSpace(string(data))
}

func (d *driver) stop() {
	_ = d.stdin.Close() // driver.py exits at the end of its input.
	var exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-exited
	}
}

// pyPlay plays hints into dir with pygazette's Player, to the log's write head, and returns
// the hints it resolved.
func pyPlay(t *testing.T, hints rl.FSMHints, dir string) rl.FSMHints {
	t.Helper()
	return *py.do(t, command{Cmd: "play", Hints: &hints, Dir: dir}).Hints
}

// pyRecorder is a pygazette Recorder in driver.py.
type pyRecorder struct {
	t    *testing.T
	name string
	dir  string
}

// pyTakeOver plays hints into dir with pygazette's Player, hands the log off to author, and
// returns pygazette's Recorder of the log from there.
func pyTakeOver(t *testing.T, hints rl.FSMHints, dir string, author rl.Author) *pyRecorder {
	t.Helper()
	var r = &pyRecorder{t: t, name: t.Name() + "/" + dir, dir: dir}
	py.do(t, command{Cmd: "take_over", Rec: r.name, Hints: &hints, Dir: dir, Author: author})
	return r
}

func (r *pyRecorder) do(c command) reply {
	r.t.Helper()
	c.Rec = r.name
	return py.do(r.t, c)
}

func (r *pyRecorder) create(path string, data []byte) {
	r.t.Helper()
	r.do(command{Cmd: "create", Path: path, Data: data})
}

func (r *pyRecorder) write(path string, offset int64, data []byte) {
	r.t.Helper()
	r.do(command{Cmd: "write", Path: path, Offset: offset, Data: data})
}

func (r *pyRecorder) link(src, dst string) {
	r.t.Helper()
	r.do(command{Cmd: "link", Src: src, Dst: dst})
}

func (r *pyRecorder) remove(path string) {
	r.t.Helper()
	r.do(command{Cmd: "remove", Path: path})
}

func (r *pyRecorder) rename(src, dst string) {
	r.t.Helper()
	r.do(command{Cmd: "rename", Src: src, Dst: dst})
}

func (r *pyRecorder) property(path, content string) {
	r.t.Helper()
	r.do(command{Cmd: "property", Path: path, Content: content})
}

func (r *pyRecorder) commit() int64 {
	r.t.Helper()
	return r.do(command{Cmd: "commit"}).End
}

func (r *pyRecorder) hints() rl.FSMHints {
	r.t.Helper()
	return *r.do(command{Cmd: "hints"}).Hints
}
