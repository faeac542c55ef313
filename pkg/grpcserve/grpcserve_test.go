package grpcserve

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// A watch stream never ends on its own: the stop must end it after grace.
func TestServeStopsOnCancelWithinGraceEvenWithOpenStreams(t *testing.T) {
	ln := listen(t)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, srv, ln, 50*time.Millisecond) }()

	cc, err := grpc.NewClient("unix://"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	watch, err := healthpb.NewHealthClient(cc).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("the stream is not open: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("a stop that ctx asked for returned %v", err)
	}
	if _, err := watch.Recv(); err == nil {
		t.Fatal("the open stream outlived the server")
	}
}

func TestServeReturnsTheServeErrorWhenServingEndsByItself(t *testing.T) {
	ln := listen(t)
	_ = ln.Close()
	err := Serve(context.Background(), grpc.NewServer(), ln, time.Second)
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("serving on a closed listener returned %v", err)
	}
}
