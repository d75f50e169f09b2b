package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of StartSentinel monitor their
// master by.
const SentinelMaster = "redistest"

// Sentinel timings: small, so that a failover takes a few seconds.
const (
	sentinelDownAfter       = 1000 * time.Millisecond // down-after-milliseconds
	sentinelFailoverTimeout = 3000 * time.Millisecond // failover-timeout
)

// Sentinel is a running Sentinel deployment: a master, one replica of it and
// three redis-sentinel processes that monitor it as SentinelMaster with a
// quorum of 2.
type Sentinel struct {
	// Servers holds the master and the replica, in that order at start;
	// after a failover the replica is the master (see Master).
	Servers   []*Server
	Sentinels []*Server
}

// SentinelAddrs returns the addresses of the sentinels.
func (s *Sentinel) SentinelAddrs() []string {
	a := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		a[i] = n.Addr()
	}
	return a
}

// Client returns a new failover client (redis.NewFailoverClient) that finds
// the master through the sentinels; the caller closes it.
func (s *Sentinel) Client() *redis.Client {
	return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: s.SentinelAddrs()})
}

// Close stops every process.
func (s *Sentinel) Close() {
	for _, n := range s.Sentinels {
		n.Close()
	}
	for _, n := range s.Servers {
		n.Close()
	}
}

// StartSentinel starts a master, a replica of it and three sentinels, and
// waits until the replica has synced and every sentinel knows the master,
// the replica and the two other sentinels (see WaitHealthy).
func StartSentinel() (*Sentinel, error) {
	if _, err := Binary("redis-sentinel"); err != nil {
		return nil, err
	}
	s := &Sentinel{}
	master, err := StartServer(Options{})
	if err != nil {
		return nil, err
	}
	s.Servers = append(s.Servers, master)
	replica, err := StartServer(Options{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}})
	if err != nil {
		s.Close()
		return nil, err
	}
	s.Servers = append(s.Servers, replica)
	for i := 0; i < 3; i++ {
		n, err := startSentinel(master.Addr())
		if err != nil {
			s.Close()
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, n)
	}
	if err := s.WaitHealthy(30 * time.Second); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// startSentinel starts one redis-sentinel on a free loopback port, with a
// configuration file of its own (a sentinel rewrites it) monitoring the
// master at masterAddr.
func startSentinel(masterAddr string) (*Server, error) {
	bin, err := Binary("redis-sentinel")
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		p, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		conf := filepath.Join(dir, "sentinel-"+strconv.Itoa(p)+".conf")
		text := strings.Join([]string{
			"port " + strconv.Itoa(p),
			"bind 127.0.0.1",
			"protected-mode no",
			"daemonize no",
			"dir " + dir,
			"logfile " + filepath.Join(dir, "redis-"+strconv.Itoa(p)+".log"),
			"sentinel monitor " + SentinelMaster + " " + host + " " + port + " 2",
			"sentinel down-after-milliseconds " + SentinelMaster + " " + strconv.Itoa(int(sentinelDownAfter/time.Millisecond)),
			"sentinel failover-timeout " + SentinelMaster + " " + strconv.Itoa(int(sentinelFailoverTimeout/time.Millisecond)),
			"sentinel parallel-syncs " + SentinelMaster + " 1",
			"",
		}, "\n")
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &Server{Port: p, dir: dir, bin: "redis-sentinel", args: []string{conf}}
		if lastErr = s.start(bin); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: could not start redis-sentinel: %w", lastErr)
}

// NewSentinel starts a Sentinel deployment for the test and stops every
// process in t.Cleanup. It fails the test, with InstallHint, when a binary
// is missing.
func NewSentinel(t testing.TB) *Sentinel {
	t.Helper()
	s, err := StartSentinel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Master returns the server every sentinel names as the master, or an error
// when they do not agree (yet) or name a server that is not running.
func (s *Sentinel) Master(ctx context.Context) (*Server, error) {
	var addr string
	for _, n := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		a, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		sc.Close()
		if err != nil {
			return nil, fmt.Errorf("sentinel %s: %w", n.Addr(), err)
		}
		got := net.JoinHostPort(a[0], a[1])
		if addr != "" && got != addr {
			return nil, fmt.Errorf("sentinels disagree on the master: %s and %s", addr, got)
		}
		addr = got
	}
	for _, m := range s.Servers {
		if m.Addr() == addr && m.PID() != 0 {
			return m, nil
		}
	}
	return nil, fmt.Errorf("the sentinels name %s, which is not a running server", addr)
}

// WaitHealthy waits until every sentinel names the same running master,
// sees it up (no s_down or o_down flag), knows its running replicas and the
// two other sentinels; that the master says role:master; and that every
// running replica has synced with it.
func (s *Sentinel) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := s.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: sentinel deployment not healthy after %v: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *Sentinel) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	master, err := s.Master(ctx)
	if err != nil {
		return err
	}
	replicas := 0
	for _, n := range s.Servers {
		if n.PID() == 0 || n == master {
			continue
		}
		replicas++
		r, err := replication(ctx, n)
		if err != nil {
			return err
		}
		if r["role"] != "slave" || r["master_port"] != strconv.Itoa(master.Port) || r["master_link_status"] != "up" {
			return fmt.Errorf("replica %s: role %s of master port %s, link %s", n.Addr(), r["role"], r["master_port"], r["master_link_status"])
		}
	}
	r, err := replication(ctx, master)
	if err != nil {
		return err
	}
	if r["role"] != "master" {
		return fmt.Errorf("master %s says role:%s", master.Addr(), r["role"])
	}
	for _, n := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		m, err := sc.Master(ctx, SentinelMaster).Result()
		sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", n.Addr(), err)
		}
		if strings.Contains(m["flags"], "down") || m["num-other-sentinels"] != strconv.Itoa(len(s.Sentinels)-1) {
			return fmt.Errorf("sentinel %s: master flags %s, %s other sentinels", n.Addr(), m["flags"], m["num-other-sentinels"])
		}
		// num-slaves counts the dead old master too after a failover: at
		// least every running replica must be known.
		if k, _ := strconv.Atoi(m["num-slaves"]); k < replicas {
			return fmt.Errorf("sentinel %s: knows %d replicas, want %d", n.Addr(), k, replicas)
		}
	}
	return nil
}

func replication(ctx context.Context, n *Server) (map[string]string, error) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.Addr(), err)
	}
	return parseInfo(info), nil
}

// Failover kills the master (SIGKILL) and waits until the sentinels have
// promoted the replica: every sentinel names it, it says role:master, and
// the deployment is healthy again without the old master. It returns the
// new master. The old master stays down.
func (s *Sentinel) Failover(timeout time.Duration) (*Server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	old, err := s.Master(ctx)
	cancel()
	if err != nil {
		return nil, err
	}
	old.Kill()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m, err := s.Master(ctx)
		cancel()
		if err == nil && m != old {
			if err := s.WaitHealthy(time.Until(deadline)); err != nil {
				return nil, err
			}
			return m, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("the sentinels still name the killed master")
			}
			return nil, fmt.Errorf("redistest: no failover after %v: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
