package hybrid

// NodeQueues returns how many Redis nodes h's decisions have sent calls to
// through queues of their own (a Cluster's masters; 0 for one server).
func NodeQueues(h *Limiter) int {
	h.asks.mu.Lock()
	defer h.asks.mu.Unlock()
	return len(h.asks.nodes)
}
