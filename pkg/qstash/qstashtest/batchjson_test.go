package qstashtest

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

// batchSeeds are /v2/batch bodies: what the relay sends, and the edges of the fast path's
// shape (escapes, non-ASCII, empty objects, keys it does not take, wrong types, trailing
// data, invalid UTF-8).
var batchSeeds = []string{
	`[{"destination":"http://127.0.0.1:1/events/a?x=1","headers":{"Content-Type":"application/json","Upstash-Deduplication-Id":"outbox-1-r0","Upstash-Forward-Traceparent":"00-ab-01"},"body":"{\"id\":1,\"note\":\"a \\\"quoted\\\" \\\\ path\"}"}]`,
	` [ { "destination" : "d" , "body" : "é😀\n\t\/" , "queue" : "q-1" } , {} ] `,
	`[]`, `[ ]`, `[{}]`, `[{"headers":{}}]`, `[{"headers":{"A":"1","A":"2"}}]`,
	`[{"destination":"d","destination":"e"}]`, `[{"Destination":"d"}]`, `[{"callback":"x"}]`,
	`[{"body":null}]`, `[{"body":""}]`, `[{"body":"\\\"\/\b\f\n\r\t"}]`, `[{"headers":null}]`, `[{"headers":{"A":1}}]`, `[{"body":1}]`,
	`[{"body":"\u00e9\ud83d\ude00"}]`, `[{"body":"\ud800"}]`, "[{\"body\":\"\xff\"}]", "[{\"body\":\"a\x01\"}]",
	`[{"body":"x"}] x`, `[{"body":"x"},]`, `[{"body":"x"}`, `{"body":"x"}`, `[{"body":"x\q"}]`, `[1]`, `[null]`,
	`[{"destination":"d","headers":{"K":"v"},"body":"b","queue":"q"},{"destination":"d2"}]`,
}

// sameDecode fails t unless the fast path either gives up on data or decodes it exactly
// as encoding/json does.
func sameDecode(t *testing.T, data []byte) {
	fast, ok := decodeBatchFast(data)
	if !ok {
		return
	}
	var want []batchRequestItem
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("fast path took %q, which encoding/json refuses: %v", data, err)
	}
	// The pairs as encoding/json reads an object: a repeated name keeps its last value.
	for i := range fast {
		if p := fast[i].headerPairs; p != nil {
			fast[i].Headers = map[string]string{}
			for j := 0; j+1 < len(p); j += 2 {
				fast[i].Headers[p[j]] = p[j+1]
			}
			fast[i].headerPairs = nil
		}
		if b := fast[i].body; b != nil {
			v := string(b)
			fast[i].Body, fast[i].body = &v, nil
		}
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("%q:\nfast %#v\njson %#v", data, fast, want)
	}
}

// FuzzBatchDecode: on any input the fast batch decoder gives up or agrees with
// encoding/json (`go test -fuzz FuzzBatchDecode ./pkg/qstash/qstashtest` explores further).
func FuzzBatchDecode(f *testing.F) {
	for _, s := range batchSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(sameDecode)
}

// TestBatchDecodeMutations: the seeds, each byte-mutated, truncated and spliced many times,
// decode the same both ways, and the relay's usual body takes the fast path.
func TestBatchDecodeMutations(t *testing.T) {
	t.Parallel()
	if _, ok := decodeBatchFast([]byte(batchSeeds[0])); !ok {
		t.Fatal("the relay's batch body does not take the fast path")
	}
	alphabet := []byte(" \t\n\"\\/{}[]:,01aAuntbfr\x00\x1f\x7f\xc3\xa9\xff")
	rng := rand.New(rand.NewPCG(7, 11))
	fastTaken := 0
	for range 50000 {
		b := []byte(batchSeeds[rng.IntN(len(batchSeeds))])
		for range 1 + rng.IntN(3) {
			if len(b) == 0 {
				break
			}
			switch i := rng.IntN(len(b)); rng.IntN(4) {
			case 0:
				b[i] = alphabet[rng.IntN(len(alphabet))]
			case 1:
				b = b[:i]
			case 2:
				b = append(b[:i:i], append([]byte{alphabet[rng.IntN(len(alphabet))]}, b[i:]...)...)
			default:
				b = append(b[:i:i], b[i+1:]...)
			}
		}
		if _, ok := decodeBatchFast(b); ok {
			fastTaken++
		}
		sameDecode(t, b)
	}
	if fastTaken == 0 {
		t.Fatal("no mutated body took the fast path: the comparison checked nothing")
	}
	t.Logf("%d of 50000 mutated bodies took the fast path", fastTaken)
}
