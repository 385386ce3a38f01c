// Command specfleet is the spec page's Go side of the wire, for the interop tests: its
// enqueuer's publishRow (the payload decoded with encoding/json into map[string]interface{},
// published with go-redis v9's XAdd) and its consumer (XREADGROUP through a consumer group,
// each message's Values as go-redis returns them, then XACK + XDEL).
//
//	specfleet publish REDIS_URL    < rows (JSON lines {"id", "stream", "payload": text|null})
//	                               > one JSON line per row: {"entry": ID} or {"error": TEXT}
//	specfleet consume REDIS_URL STREAM GROUP COUNT
//	                               > one JSON line per message: {"id": ID, "values": {...}}
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

type row struct {
	ID      string  `json:"id"`
	Stream  string  `json:"stream"`
	Payload *string `json:"payload"`
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: specfleet publish URL | consume URL STREAM GROUP COUNT")
	}
	ctx := context.Background()
	opts, err := redis.ParseURL(os.Args[2])
	if err != nil {
		fail(err.Error())
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close() //nolint:errcheck
	out := json.NewEncoder(os.Stdout)
	switch os.Args[1] {
	case "publish":
		publish(ctx, rdb, out)
	case "consume":
		if len(os.Args) != 6 {
			fail("usage: specfleet consume URL STREAM GROUP COUNT")
		}
		count, err := strconv.Atoi(os.Args[5])
		if err != nil {
			fail(err.Error())
		}
		consume(ctx, rdb, out, os.Args[3], os.Args[4], count)
	default:
		fail("unknown command " + os.Args[1])
	}
}

func publish(ctx context.Context, rdb *redis.Client, out *json.Encoder) {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	for in.Scan() {
		var r row
		if err := json.Unmarshal(in.Bytes(), &r); err != nil {
			fail(err.Error())
		}
		var raw []byte
		if r.Payload != nil {
			raw = []byte(*r.Payload)
		}
		id, err := publishRow(ctx, rdb, r.ID, r.Stream, raw)
		if err != nil {
			must(out.Encode(map[string]string{"error": err.Error()}))
		} else {
			must(out.Encode(map[string]string{"entry": id}))
		}
	}
	must(in.Err())
}

// publishRow is the spec page's, verbatim but for returning the entry id: the spec's
// stream.Publisher is XAdd with the values map.
func publishRow(ctx context.Context, rdb *redis.Client, id, stream string, raw []byte) (string, error) {
	var payload map[string]interface{}
	if len(raw) == 0 {
		payload = map[string]interface{}{"id": id}
	} else if err := json.Unmarshal(raw, &payload); err != nil {
		payload = map[string]interface{}{"data": string(raw)}
	}
	if stream == "" {
		stream = "workflow.tasks"
	}
	return rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: payload}).Result()
}

func consume(ctx context.Context, rdb *redis.Client, out *json.Encoder, stream, group string, count int) {
	err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && err.Error() != "BUSYGROUP Consumer Group name already exists" {
		fail("xgroup create: " + err.Error())
	}
	for seen := 0; seen < count; {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: "specfleet", Streams: []string{stream, ">"},
			Count: int64(count - seen), Block: 10 * time.Second,
		}).Result()
		if err != nil {
			fail(fmt.Sprintf("xreadgroup after %d of %d: %v", seen, count, err))
		}
		for _, s := range res {
			for _, m := range s.Messages {
				must(out.Encode(map[string]interface{}{"id": m.ID, "values": m.Values}))
				rdb.XAck(ctx, stream, group, m.ID)
				rdb.XDel(ctx, stream, m.ID)
				seen++
			}
		}
	}
}

func must(err error) {
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "specfleet:", msg)
	os.Exit(2)
}
