.PHONY: test sim bench fmt vet

# Run every test against real Redis; installs redis-server when missing.
test:
	bash scripts/test.sh

# The main job: the multi-instance simulation (embedded Redis by default).
sim:
	go run ./cmd/ratelimit-sim

bench:
	go test -run '^$$' -bench . -benchmem ./...

fmt:
	gofmt -w .

vet:
	go vet ./...
