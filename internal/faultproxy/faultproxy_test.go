package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridlimit/ratelimit/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// setup starts a redis-server and a proxy in front of it, and returns a
// client through the proxy that never retries. Everything is closed in
// t.Cleanup, the client first.
func setup(t *testing.T) (*redistest.Server, *Proxy, *redis.Client) {
	t.Helper()
	srv := redistest.Standalone(t)
	p, err := New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	c := newClient(t, p.Addr())
	return srv, p, c
}

func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true, // honour per-call context deadlines
		PoolSize:              1,
		DialTimeout:           time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// mustPing fails the test unless a PING through c succeeds.
func mustPing(t *testing.T, c *redis.Client) {
	t.Helper()
	if err := c.Ping(ctxT(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
}

func TestPassThrough(t *testing.T) {
	srv, p, c := setup(t)
	ctx := ctxT(t, 5*time.Second)
	if err := c.Set(ctx, "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v", got, err)
	}
	direct := srv.Client()
	defer direct.Close()
	if got, err := direct.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("direct GET = %q, %v", got, err)
	}
	st := p.Stats()
	if st.Accepted < 1 || st.Active != 1 || st.BytesUp == 0 || st.BytesDown == 0 || st.RepliesDropped != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestLatency(t *testing.T) {
	_, p, c := setup(t)
	mustPing(t, c) // connect first
	const lat = 50 * time.Millisecond
	p.SetLatency(lat)
	start := time.Now()
	mustPing(t, c)
	if el := time.Since(start); el < lat {
		t.Fatalf("PING took %v with latency %v", el, lat)
	}
	p.SetLatency(0)
	mustPing(t, c)
}

func TestCut(t *testing.T) {
	_, p, c := setup(t)
	mustPing(t, c)
	// Make a call in flight, then cut it.
	p.SetLatency(300 * time.Millisecond)
	errc := make(chan error, 1)
	go func() { errc <- c.Ping(context.Background()).Err() }()
	time.Sleep(100 * time.Millisecond)
	p.Cut()
	if err := <-errc; err == nil {
		t.Fatal("in-flight PING succeeded across Cut")
	}
	if st := p.Stats(); st.Active != 0 {
		t.Fatalf("active after Cut = %d", st.Active)
	}
	p.SetLatency(0)
	mustPing(t, c) // the client reconnects through the proxy
	if st := p.Stats(); st.Accepted < 2 || st.Active != 1 {
		t.Fatalf("stats after reconnect = %+v", st)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func TestBlock(t *testing.T) {
	_, p, c := setup(t)
	mustPing(t, c)
	p.Block(true)
	for i := 0; i < 2; i++ { // an open connection, then a fresh one
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil || !isTimeout(err) {
			t.Fatalf("call %d while blocked: err = %v, want a timeout", i, err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("call %d took %v, want about 200ms", i, el)
		}
	}
	if p.Stats().Accepted < 2 {
		t.Fatalf("blocked proxy did not accept the new connection: %+v", p.Stats())
	}
	p.Block(false)
	mustPing(t, c)
}

func TestBlockHoldsThenForwards(t *testing.T) {
	_, p, c := setup(t)
	mustPing(t, c)
	p.Block(true)
	errc := make(chan error, 1)
	go func() { errc <- c.Set(context.Background(), "held", "1", time.Minute).Err() }()
	select {
	case err := <-errc:
		t.Fatalf("SET returned while blocked: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	p.Block(false)
	if err := <-errc; err != nil {
		t.Fatalf("held SET after unblock: %v", err)
	}
}

func TestRefuse(t *testing.T) {
	_, p, c := setup(t)
	mustPing(t, c)
	p.Refuse(true)
	if st := p.Stats(); st.Active != 0 {
		t.Fatalf("active after Refuse = %d", st.Active)
	}
	for i := 0; i < 2; i++ {
		if err := c.Ping(ctxT(t, 2*time.Second)).Err(); err == nil {
			t.Fatalf("call %d succeeded while refusing", i)
		}
	}
	p.Refuse(false)
	mustPing(t, c)
}

func TestDropReplies(t *testing.T) {
	srv, p, c := setup(t)
	mustPing(t, c) // the connection and its handshake exist before the drop
	p.DropReplies(1)
	ctx := ctxT(t, 5*time.Second)
	if err := c.Incr(ctx, "k").Err(); err == nil {
		t.Fatal("INCR got a reply that should have been dropped")
	}
	direct := srv.Client()
	defer direct.Close()
	if got, err := direct.Get(ctx, "k").Int(); err != nil || got != 1 {
		t.Fatalf("server-side k = %d, %v; want 1 (the command was applied)", got, err)
	}
	if st := p.Stats(); st.RepliesDropped != 1 {
		t.Fatalf("RepliesDropped = %d", st.RepliesDropped)
	}
	// Only one reply is dropped: the client reconnects and works.
	if got, err := c.Incr(ctx, "k").Result(); err != nil || got != 2 {
		t.Fatalf("INCR after drop = %d, %v", got, err)
	}
}

func TestSetTarget(t *testing.T) {
	_, p, c := setup(t)
	srvB := redistest.Standalone(t)
	ctx := ctxT(t, 5*time.Second)
	if err := c.Set(ctx, "where", "a", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	p.SetTarget(srvB.Addr())
	// The open connection keeps its server.
	if got, _ := c.Get(ctx, "where").Result(); got != "a" {
		t.Fatalf("open connection moved: GET = %q", got)
	}
	p.Cut()
	if err := c.Get(ctx, "where").Err(); err != redis.Nil {
		// The first call after Cut may fail on the dead connection.
		if err := c.Get(ctx, "where").Err(); err != redis.Nil {
			t.Fatalf("new connection not on B: GET err = %v", err)
		}
	}
}

func TestCloseNoLeak(t *testing.T) {
	srv := redistest.Standalone(t)
	ignore := goleak.IgnoreCurrent()
	p, err := New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, PoolSize: 4})
	ctx := ctxT(t, 5*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Leave connections stalled in every way: blocked, delayed, idle.
	p.SetLatency(time.Hour)
	go c.Ping(context.Background())
	time.Sleep(50 * time.Millisecond)
	p.Block(true)
	raw, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write([]byte("PING\r\n"))
	time.Sleep(50 * time.Millisecond)

	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still listening after Close")
	}
	c.Close()
	goleak.VerifyNone(t, ignore)
}

func TestDialFailure(t *testing.T) {
	// A target nobody listens on: connections are accepted, then closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p, err := New(dead)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := newClient(t, p.Addr())
	if err := c.Ping(ctxT(t, 5*time.Second)).Err(); err == nil {
		t.Fatal("PING through a proxy to a dead target succeeded")
	}
}

// DropReplyTo loses the reply to exactly the marked request, after the
// server applied it, whatever handshakes or other commands come first.
func TestDropReplyTo(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer c.Close()
	direct := srv.Client()
	defer direct.Close()

	p.DropReplyTo([]byte("marked-key"))
	require.NoError(t, c.Incr(ctx, "other-key").Err(), "an unmarked request is answered")
	require.Error(t, c.Incr(ctx, "marked-key").Err(), "the marked request's reply is lost")
	require.Equal(t, "1", direct.Get(ctx, "marked-key").Val(), "the server applied it")
	require.EqualValues(t, 2, c.Incr(ctx, "marked-key").Val(), "one-shot: the next one is answered")
	require.EqualValues(t, 1, p.Stats().RepliesDropped)
}

// SetDelay is a link's delay: every request and its reply take twice the
// delay, and no more, however many follow it on the same connection: the
// chunks behind one are not held up by it, and keep their order. Stalling
// each chunk instead (SetLatency) makes a request sent while the one before
// it waits take up to half as long again (measured: 2d to 3d).
func TestDelayPipelines(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	const d = 200 * time.Millisecond
	p.SetDelay(d)

	conn, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))

	// k requests, each its own chunk, d/10 apart, so that several are on
	// the way at once in each direction.
	const k = 20
	sent := make([]time.Time, k)
	werr := make(chan error, 1)
	go func() {
		for i := range k {
			sent[i] = time.Now()
			if _, err := fmt.Fprintf(conn, "ECHO m%02d\r\n", i); err != nil {
				werr <- err
				return
			}
			time.Sleep(d / 10)
		}
		werr <- nil
	}()
	rtt := make([]time.Duration, k)
	for i := range k {
		got := make([]byte, len("$3\r\nm00\r\n"))
		_, err := io.ReadFull(conn, got)
		require.NoError(t, err)
		rtt[i] = time.Since(sent[i]) // sent[i] was written before the request, so before its reply
		require.Equal(t, fmt.Sprintf("$3\r\nm%02d\r\n", i), string(got), "replies in order")
	}
	require.NoError(t, <-werr)
	for i, r := range rtt {
		require.GreaterOrEqual(t, r, 2*d, "request %d: a round trip pays the delay both ways", i)
		require.Less(t, r, 2*d+d/2, "request %d waited behind the ones before it", i)
	}
}

// SetDelay applies to connections accepted after it; 0 removes it for new
// ones. The other faults still apply to delayed chunks.
func TestDelayNewConnectionsAndFaults(t *testing.T) {
	srv, p, c := setup(t)
	mustPing(t, c) // this connection is open before the delay
	p.SetDelay(time.Hour)
	mustPing(t, c) // within mustPing's 5s: the open connection keeps its delay (none)

	p.SetDelay(20 * time.Millisecond)
	c2 := newClient(t, p.Addr())
	mustPing(t, c2)
	ctx := ctxT(t, 5*time.Second)
	p.DropReplyTo([]byte("delayed-key"))
	require.Error(t, c2.Incr(ctx, "delayed-key").Err(), "the marked reply is lost on a delayed link too")
	direct := srv.Client()
	defer direct.Close()
	require.Equal(t, "1", direct.Get(ctx, "delayed-key").Val(), "the server applied it")
	require.EqualValues(t, 2, c2.Incr(ctx, "delayed-key").Val())
	require.EqualValues(t, 1, p.Stats().RepliesDropped)

	p.Block(true)
	bctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := c2.Ping(bctx).Err()
	cancel()
	require.Error(t, err, "a blocked proxy holds delayed chunks too")
	p.Block(false)
	p.SetDelay(0)
	mustPing(t, newClient(t, p.Addr()))
}

// What a server sends before it closes the connection arrives, after the
// delay, before the close.
func TestDelayDeliversBeforeClose(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	p.SetDelay(50 * time.Millisecond)
	conn, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = conn.Write([]byte("QUIT\r\n"))
	require.NoError(t, err)
	got, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Equal(t, "+OK\r\n", string(got), "the reply, then EOF")
	require.Eventually(t, func() bool { return p.Stats().Active == 0 }, 5*time.Second, 10*time.Millisecond)
}
