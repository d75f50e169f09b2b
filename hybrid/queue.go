package hybrid

import (
	"context"
	gosync "sync"

	"github.com/redis/go-redis/v9"
)

// queued is what decisions send to Redis and wait for: a key's lease call
// (leaseCall), or a cold key's exact call (exactCall).
type queued interface {
	request() request
	base() string // the Redis key base, which names the node
}

// queue gathers what decisions must send to one Redis node now and hands
// it to send in batches: up to maxInFlight batches on their way at once,
// what is queued meanwhile going out together in the next (auto-
// pipelining). An idle queue sends at once: no timer adds latency to a
// lone call.
type queue struct {
	mu          gosync.Mutex
	items       []queued
	running     int // goroutines sending batches
	maxInFlight int
	send        func(batch []queued)
	wg          *gosync.WaitGroup // the goroutines sending, for Close to wait on
}

// add queues t, and starts a goroutine to send it when fewer than
// maxInFlight are sending.
func (q *queue) add(t queued) {
	q.mu.Lock()
	q.items = append(q.items, t)
	start := q.running < q.maxInFlight
	if start {
		q.running++
		q.wg.Add(1)
	}
	q.mu.Unlock()
	if start {
		go q.drain()
	}
}

// drain sends queued batches until none is left.
func (q *queue) drain() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		batch := q.items
		q.items = nil
		if len(batch) == 0 {
			q.running--
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		q.send(batch)
	}
}

// idle reports whether nothing is queued or being sent.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running == 0 && len(q.items) == 0
}

// router queues decisions' calls by Redis node: one queue for a server
// (standalone or Sentinel), one per master of a Cluster, so that calls
// for different nodes never wait on each other's round trips.
type router struct {
	cluster *redis.ClusterClient // nil: one node
	one     *queue
	make    func() *queue

	mu    gosync.Mutex
	nodes map[string]*queue // Cluster master address -> its queue
}

func newRouter(client rediser, make func() *queue) *router {
	r := &router{one: make(), make: make}
	r.cluster, _ = client.(*redis.ClusterClient)
	return r
}

// add queues t for the node that owns its key.
func (r *router) add(t queued) {
	r.queueOf(t.base()).add(t)
}

func (r *router) queueOf(base string) *queue {
	if r.cluster == nil {
		return r.one
	}
	node, err := r.cluster.MasterForKey(context.Background(), base)
	if err != nil {
		return r.one // the client routes it, with its own errors
	}
	addr := node.Options().Addr
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.nodes[addr]
	if q == nil {
		if r.nodes == nil {
			r.nodes = make(map[string]*queue)
		}
		q = r.make()
		r.nodes[addr] = q
	}
	return q
}

// idle reports whether no queue holds or sends anything.
func (r *router) idle() bool {
	if !r.one.idle() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, q := range r.nodes {
		if !q.idle() {
			return false
		}
	}
	return true
}
