package hybrid

import gosync "sync"

// queue gathers what must reach Redis now, for decisions waiting on it, and
// hands it to send in batches: up to maxInFlight batches on their way at
// once, what is queued meanwhile going out together in the next. An idle
// queue sends at once: no timer adds latency to a lone item.
type queue[T any] struct {
	mu          gosync.Mutex
	items       []T
	running     int // goroutines sending batches
	maxInFlight int
	send        func(batch []T)
	wg          *gosync.WaitGroup // the goroutines sending, for Close to wait on
}

// add queues t, and starts a goroutine to send it when fewer than
// maxInFlight are sending.
func (q *queue[T]) add(t T) {
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
func (q *queue[T]) drain() {
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
func (q *queue[T]) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running == 0 && len(q.items) == 0
}
