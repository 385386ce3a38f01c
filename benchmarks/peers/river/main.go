// Command riverbench is River's side of `make bench-peers` (benchmarks/peers): River's
// defaults but MaxWorkers, a no-op worker that notes when each job starts, and a producer that
// inserts jobs inside its own transactions, as an application does.
//
//	riverbench migrate DB_URL
//	riverbench work DB_URL HANDLED_LOG MAX_WORKERS     (until SIGTERM)
//	riverbench produce DB_URL TASKS PER_COMMIT GAP_MS PREFIX COMMIT_LOG
//
// Both logs are lines "<task> <unix ns>": the handler's start, the commit's return. The
// producer connects, prints "ready", waits for a line on stdin, produces, writes its log,
// prints "done" and exits when stdin closes (its backend stays until the harness has read the
// CPU it spent).
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// NoopArgs is the job: one task id, as the other systems' tasks carry.
type NoopArgs struct {
	Task string `json:"task"`
}

func (NoopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[NoopArgs]
	mu  sync.Mutex
	log *os.File
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[NoopArgs]) error {
	line := job.Args.Task + " " + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n"
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := w.log.WriteString(line)
	return err
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: riverbench migrate|work|produce DB_URL ...")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Args[2])
	must(err)
	defer pool.Close()
	switch os.Args[1] {
	case "migrate":
		migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
		must(err)
		_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		must(err)
	case "work":
		work(ctx, pool, os.Args[3], atoi(os.Args[4]))
	case "produce":
		produce(ctx, pool, atoi(os.Args[3]), atoi(os.Args[4]), atoi(os.Args[5]), os.Args[6], os.Args[7])
	default:
		fail("unknown command " + os.Args[1])
	}
}

func work(ctx context.Context, pool *pgxpool.Pool, logPath string, maxWorkers int) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(err)
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{log: log})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers: workers,
	})
	must(err)
	must(client.Start(ctx))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	must(client.Stop(stopCtx))
}

func produce(ctx context.Context, pool *pgxpool.Pool, tasks, perCommit, gapMs int, prefix, logPath string) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{}) // insert only
	must(err)
	conn, err := pool.Acquire(ctx) // one session, as one application connection
	must(err)
	defer conn.Release()
	stdin := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	_, err = stdin.ReadString('\n')
	must(err)

	var out strings.Builder
	for i := 0; i < tasks; i += perCommit {
		if gapMs > 0 {
			time.Sleep(time.Duration(gapMs) * time.Millisecond)
		}
		n := min(perCommit, tasks-i)
		tx, err := conn.Begin(ctx)
		must(err)
		if n == 1 {
			_, err = client.InsertTx(ctx, tx, NoopArgs{Task: prefix + "-" + strconv.Itoa(i)}, nil)
		} else {
			params := make([]river.InsertManyParams, n)
			for j := range n {
				params[j] = river.InsertManyParams{Args: NoopArgs{Task: prefix + "-" + strconv.Itoa(i+j)}}
			}
			_, err = client.InsertManyTx(ctx, tx, params)
		}
		must(err)
		must(tx.Commit(ctx))
		now := strconv.FormatInt(time.Now().UnixNano(), 10)
		for j := range n {
			out.WriteString(prefix + "-" + strconv.Itoa(i+j) + " " + now + "\n")
		}
	}
	must(os.WriteFile(logPath, []byte(out.String()), 0o644))
	fmt.Println("done")
	_, _ = stdin.ReadString('\n') // until the harness closes stdin
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	must(err)
	return n
}

func must(err error) {
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "riverbench:", msg)
	os.Exit(2)
}
