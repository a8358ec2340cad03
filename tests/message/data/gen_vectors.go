//go:build ignore

// Generates gazette_vectors.txt from Gazette's own message package:
//   go mod init vec && go get go.gazette.dev/core@v0.103.0 && go run gen_vectors.go > gazette_vectors.txt
package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	pb "go.gazette.dev/core/broker/protocol"
	"go.gazette.dev/core/message"
)

type frameable []byte

func (f frameable) ProtoSize() int                   { return len(f) }
func (f frameable) MarshalTo(b []byte) (int, error)  { return copy(b, f), nil }
func (f *frameable) Unmarshal(b []byte) error        { *f = append((*f)[:0], b...); return nil }

func main() {
	producers := []message.ProducerID{
		{0x01, 0x02, 0x03, 0x04, 0x05, 0x06},
		{0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa},
		{0x81, 0x00, 0x00, 0x00, 0x00, 0x01},
	}
	times := []time.Time{
		time.Unix(0, 0), time.Unix(12, 300), time.Unix(1567304621, 981273734),
		time.Unix(1712345678, 123456789), time.Unix(4102444800, 999999999),
	}
	for _, p := range producers {
		for _, t := range times {
			for _, ticks := range []int{0, 1, 7} {
				for _, fl := range []message.Flags{message.Flag_OUTSIDE_TXN, message.Flag_CONTINUE_TXN, message.Flag_ACK_TXN, 682, 0x3ff} {
					c := message.NewClock(t)
					for i := 0; i < ticks; i++ {
						c.Tick()
					}
					u := message.BuildUUID(p, c, fl)
					sec, nsec := u.Time().UnixTime()
					fmt.Printf("uuid %s %d %d %d %d %s %d %d %d\n", hex.EncodeToString(p[:]), t.Unix(), t.Nanosecond(), ticks, fl, u.String(), uint64(message.GetClock(u)), sec, nsec)
				}
			}
		}
	}
	// Raw clocks with sequence bits set.
	for _, c := range []message.Clock{1, 0xf, 0x10, 0x123456789abcdef, 0xfffffffffffffff} {
		u := message.BuildUUID(producers[0], c, message.Flag_CONTINUE_TXN)
		fmt.Printf("rawclock %d %s %d\n", uint64(c), u.String(), uint64(message.GetClock(u)))
	}
	// Mappings.
	var lr pb.ListResponse
	for _, n := range []string{"a/part-000", "a/part-001", "a/part-002", "a/part-003", "a/part-004", "b/other"} {
		lr.Journals = append(lr.Journals, pb.ListResponse_Journal{Spec: pb.JournalSpec{Name: pb.Journal(n)}})
	}
	keyFn := func(m message.Mappable, w io.Writer) { _, _ = w.Write(m.([]byte)) }
	mod := message.ModuloMapping(keyFn, func() *pb.ListResponse { return &lr })
	ren := message.RendezvousMapping(keyFn, func() *pb.ListResponse { return &lr })
	for _, k := range []string{"", "a", "key-1", "key-2", "user-12345", "日本語", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"} {
		j1, _, _ := mod([]byte(k))
		j2, _, _ := ren([]byte(k))
		fmt.Printf("mapping %s %s %s\n", hex.EncodeToString([]byte(k)), j1, j2)
	}
	// Fixed framing.
	fr, _ := message.FramingByContentType("application/x-protobuf-fixed")
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	for _, p := range [][]byte{{}, []byte("hello"), bytes.Repeat([]byte{0xab}, 300)} {
		buf.Reset()
		fp := frameable(p)
		_ = fr.Marshal(&fp, bw)
		_ = bw.Flush()
		fmt.Printf("fixed %s %s\n", hex.EncodeToString(p), hex.EncodeToString(buf.Bytes()))
	}
	// CSV framing.
	cf, _ := message.FramingByContentType("text/csv")
	for _, r := range []message.CSVRecord{
		{"u", "plain", "1"}, {"u", "with,comma", "with \"quote\""}, {"u", "multi\nline", ""}, {"u", " lead", "trail "}, {"u", ""}, {"u", "\r\n"},
	} {
		buf.Reset()
		rr := r
		_ = cf.Marshal(&rr, bw)
		_ = bw.Flush()
		fmt.Printf("csv %q\n", buf.String())
	}
	_ = os.Stdout.Sync()
}
