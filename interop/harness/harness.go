// Package harness starts the brokers the conformance suite runs against: a pygazette broker
// (`pygazette serve`), and the released Gazette broker with the etcd it needs, each on a free
// loopback port with its own scratch directory and file:// store root.
package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	pb "go.gazette.dev/core/broker/protocol"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Broker is one broker under test, and the processes behind it.
type Broker struct {
	Name     string      // "pygazette" or "gazette".
	Endpoint pb.Endpoint // Its gRPC endpoint, http://127.0.0.1:<port>.
	FileRoot string      // The directory rooting its file:// fragment stores.

	procs []*process
	logs  []string
}

type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // Closed once the process exited (and was reaped).
}

// RepoRoot is the pygazette checkout holding this module (interop/ is one level down).
func RepoRoot() string {
	var wd, err = os.Getwd()
	if err != nil {
		panic(err)
	}
	for dir := wd; dir != "/"; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "pyproject.toml")); err == nil {
			return dir
		}
	}
	panic("no pyproject.toml above " + wd)
}

// BinDir holds gazette, gazctl and etcd, as built by interop/build-binaries.
func BinDir() string {
	if dir := os.Getenv("INTEROP_BIN"); dir != "" {
		return dir
	}
	return filepath.Join(RepoRoot(), "interop", "bin")
}

// Start starts the named broker ("pygazette" or "gazette") under the scratch directory dir.
func Start(name, dir string) (*Broker, error) {
	var b = &Broker{Name: name, FileRoot: filepath.Join(dir, "fragments")}
	if err := os.MkdirAll(b.FileRoot, 0o755); err != nil {
		return nil, err
	}
	var err error
	switch name {
	case "pygazette":
		err = b.startPygazette(dir)
	case "gazette":
		err = b.startGazette(dir)
	default:
		err = fmt.Errorf("unknown broker %q (want pygazette or gazette)", name)
	}
	if err == nil {
		err = b.waitServing(60 * time.Second)
	}
	if err != nil {
		var logs = b.Logs()
		b.Stop()
		return nil, fmt.Errorf("starting %s: %w\n%s", name, err, logs)
	}
	return b, nil
}

func (b *Broker) startPygazette(dir string) error {
	var port, err = freePort()
	if err != nil {
		return err
	}
	var exe = os.Getenv("PYGAZETTE")
	if exe == "" {
		exe = filepath.Join(RepoRoot(), ".venv", "bin", "pygazette")
	}
	b.Endpoint = pb.Endpoint(fmt.Sprintf("http://127.0.0.1:%d", port))
	return b.spawn(filepath.Join(dir, "pygazette.log"), exe, "serve",
		"--port", fmt.Sprint(port),
		"--data-dir", filepath.Join(dir, "data"),
		"--file-root", b.FileRoot,
	)
}

func (b *Broker) startGazette(dir string) error {
	var clientPort, err1 = freePort()
	var peerPort, err2 = freePort()
	var port, err3 = freePort()
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return err
		}
	}
	var etcdURL = fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	var peerURL = fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	if err := b.spawn(filepath.Join(dir, "etcd.log"), filepath.Join(BinDir(), "etcd"),
		"--name=conformance",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=conformance="+peerURL,
		"--log-level=warn",
	); err != nil {
		return err
	}
	b.Endpoint = pb.Endpoint(fmt.Sprintf("http://127.0.0.1:%d", port))
	return b.spawn(filepath.Join(dir, "gazette.log"), filepath.Join(BinDir(), "gazette"), "serve",
		"--broker.host=127.0.0.1",
		fmt.Sprintf("--broker.port=%d", port),
		"--broker.id=gazette-conformance",
		"--broker.zone=local",
		"--broker.file-root="+b.FileRoot,
		"--broker.watch-delay=0s",
		"--etcd.address="+etcdURL,
		"--log.level=warn",
	)
}

func (b *Broker) spawn(logPath, exe string, args ...string) error {
	var log, err = os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	var cmd = exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = RepoRoot()
	// Should the test binary die without stopping its brokers, they die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err = cmd.Start(); err != nil {
		return fmt.Errorf("running %s: %w", exe, err)
	}
	var proc = &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(proc.exited)
	}()
	b.procs = append(b.procs, proc)
	b.logs = append(b.logs, logPath)
	return nil
}

// waitServing waits until List answers with this broker's own process ID: the broker is
// up, and a Gazette broker has joined etcd.
func (b *Broker) waitServing(timeout time.Duration) error {
	var ctx, cancel = context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var conn, err = grpc.NewClient(b.Endpoint.GRPCAddr(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	var jc = pb.NewJournalClient(conn)

	for {
		for _, proc := range b.procs {
			select {
			case <-proc.exited:
				return fmt.Errorf("%s exited early", proc.cmd.Path)
			default:
			}
		}
		var attempt, stop = context.WithTimeout(ctx, 2*time.Second)
		var stream, err = jc.List(attempt, &pb.ListRequest{})
		if err == nil {
			var resp, err2 = stream.Recv()
			if err2 == nil && resp.Status == pb.Status_OK && resp.Header.ProcessId.Suffix != "" {
				stop()
				return nil
			}
		}
		stop()
		select {
		case <-ctx.Done():
			return fmt.Errorf("not serving after %s", timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop kills the broker's processes (a lone Gazette broker never completes a graceful exit:
// it waits to hand its journals to another broker).
func (b *Broker) Stop() {
	for i := len(b.procs) - 1; i >= 0; i-- {
		_ = b.procs[i].cmd.Process.Kill()
		<-b.procs[i].exited
	}
	b.procs = nil
}

// Logs returns the tail of each process log, for failure messages.
func (b *Broker) Logs() string {
	var out strings.Builder
	for _, path := range b.logs {
		var data, _ = os.ReadFile(path)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&out, "--- %s\n%s\n", path, data)
	}
	return out.String()
}

func freePort() (int, error) {
	var l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
