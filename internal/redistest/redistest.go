// Package redistest starts real redis-server processes for tests: a
// standalone server, a 6-node Redis Cluster (3 masters, 3 replicas) and a
// Sentinel deployment (a master, a replica and three redis-sentinel
// processes), on free loopback ports, each stopped by PID when the test ends.
//
// A missing redis-server, redis-cli or redis-sentinel is a test failure that
// says how to install them, never a skip: the tests of this module are meant
// to run against real Redis.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstallHint tells how to get the Redis binaries.
const InstallHint = "redis-server, redis-cli and redis-sentinel are required: on Debian/Ubuntu run " +
	"`apt-get install -y redis-server redis-sentinel` (or `make test`, which installs them); elsewhere install " +
	"Redis >= 6.2 and put redis-server, redis-cli and redis-sentinel on PATH"

// Binary returns the path of the named Redis binary ("redis-server",
// "redis-cli" or "redis-sentinel"), or an error carrying InstallHint.
func Binary(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("redistest: %s not found on PATH: %s", name, InstallHint)
	}
	return p, nil
}

// Server is one redis-server (or redis-sentinel) process on 127.0.0.1.
type Server struct {
	Port  int
	dir   string
	bin   string // the binary's name, for Restart
	args  []string
	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	extra []string
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// PID returns the process id of the running server, or 0.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Options configure StartServer.
type Options struct {
	// Cluster starts the server with cluster-enabled yes.
	Cluster bool
	// Args are extra redis-server arguments, e.g. "--maxmemory", "1mb".
	Args []string
}

// StartServer starts a redis-server on a free loopback port and waits until
// it answers PING. Stop it with Close.
func StartServer(opt Options) (*Server, error) {
	bin, err := Binary("redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Port: port, dir: dir, bin: "redis-server", extra: opt.Args}
		s.args = []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--protected-mode", "no",
			"--logfile", filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log"),
		}
		if opt.Cluster {
			s.args = append(s.args, "--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes-"+strconv.Itoa(port)+".conf"),
				"--cluster-node-timeout", "1500")
		}
		s.args = append(s.args, opt.Args...)
		if err := s.start(bin); err != nil {
			lastErr = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: could not start redis-server: %w", lastErr)
}

func (s *Server) start(bin string) error {
	cmd := exec.Command(bin, s.args...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := waitPing(s.Addr(), done, 10*time.Second); err != nil {
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("%w; log: %s", err, s.logTail())
	}
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.Port)+".log"))
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}

func waitPing(addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	for {
		select {
		case <-exited:
			return errors.New("redis-server exited during start")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil || strings.HasPrefix(err.Error(), "NOAUTH") {
			return nil // a server started with --requirepass answers too
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server at %s not ready after %v: %v", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Kill stops the server with SIGKILL and waits for the process to exit. Its
// data is lost (no persistence).
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT) // a frozen process must be able to die
	cmd.Process.Kill()
	<-done
}

// Restart starts the server again on the same port after Kill.
func (s *Server) Restart() error {
	s.Kill()
	bin, err := Binary(s.bin)
	if err != nil {
		return err
	}
	var lastErr error
	for i := 0; i < 50; i++ { // the port may linger briefly
		if lastErr = s.start(bin); lastErr == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return lastErr
}

// Freeze sends SIGSTOP: the server keeps its connections open but answers
// nothing, like a hung process.
func (s *Server) Freeze() error { return s.signal(syscall.SIGSTOP) }

// Thaw sends SIGCONT after Freeze.
func (s *Server) Thaw() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	s.Kill()
	os.RemoveAll(s.dir)
}

// Client returns a new client for the server; the caller closes it.
func (s *Server) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr()})
}

// Standalone starts a standalone redis-server for the test and stops it (by
// PID) in t.Cleanup. It fails the test, with InstallHint, when redis-server
// is missing.
func Standalone(t testing.TB, args ...string) *Server {
	t.Helper()
	s, err := StartServer(Options{Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Cluster is a running Redis Cluster of 3 masters and 3 replicas.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the seed addresses of every node.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr()
	}
	return a
}

// Client returns a new cluster client; the caller closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
}

// Close stops every node.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		n.Close()
	}
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// StartCluster starts six cluster-enabled servers, joins them with
// `redis-cli --cluster create --cluster-replicas 1`, and waits until every
// node reports cluster_state:ok with all 16384 slots assigned.
func StartCluster() (*Cluster, error) {
	cli, err := Binary("redis-cli")
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for i := 0; i < 6; i++ {
		s, err := StartServer(Options{Cluster: true})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// all 16384 slots assigned, every replica has synced with its master, and a
// cluster client can reach every master.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster not healthy after %v: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if n.PID() == 0 {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		info, err := rc.ClusterInfo(ctx).Result()
		rc.Close()
		if err != nil {
			return err
		}
		fields := parseInfo(info)
		if fields["cluster_state"] != "ok" || fields["cluster_slots_assigned"] != "16384" || fields["cluster_slots_ok"] != "16384" {
			return fmt.Errorf("node %s: state=%s slots_ok=%s", n.Addr(), fields["cluster_state"], fields["cluster_slots_ok"])
		}
		// A replica that has not finished its first sync cannot take over
		// from its master: failover tests need every replica in sync.
		rc = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		repl, err := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err != nil {
			return err
		}
		r := parseInfo(repl)
		if r["role"] == "slave" && r["master_link_status"] != "up" {
			return fmt.Errorf("replica %s: link to its master is %s", n.Addr(), r["master_link_status"])
		}
	}
	cc := c.Client()
	defer cc.Close()
	return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.Ping(ctx).Err()
	})
}

func parseInfo(s string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok {
			m[k] = v
		}
	}
	return m
}

// NewCluster starts a 6-node Cluster for the test and stops every node in
// t.Cleanup. It fails the test, with InstallHint, when the binaries are
// missing.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// KeysWithoutTTL returns the keys on client (every master of a Cluster) that
// have no expiry. Tests call it at the end to prove no key lives forever.
func KeysWithoutTTL(ctx context.Context, client redis.UniversalClient) ([]string, error) {
	var (
		mu  sync.Mutex
		bad []string
	)
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				return err
			}
			if ttl == -1 { // -2: gone meanwhile
				mu.Lock()
				bad = append(bad, k)
				mu.Unlock()
			}
		}
		return iter.Err()
	}
	switch cl := client.(type) {
	case *redis.ClusterClient:
		err := cl.ForEachMaster(ctx, scan)
		return bad, err
	case *redis.Client:
		return bad, scan(ctx, cl)
	}
	return nil, fmt.Errorf("redistest: unsupported client %T", client)
}
