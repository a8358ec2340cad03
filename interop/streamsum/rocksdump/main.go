// Command rocksdump opens a RocksDB directory with Gazette's RocksDB binding (gorocksdb,
// cgo against the system's librocksdb: Debian's 7.8 here) and prints every key and value
// as one JSON object of hex strings on stdout. pygazette's interop tests use it to show that
// a RocksDB which pygazette's RocksDBStore recorded, recovered by `gazctl shards recover`,
// opens in Go with the same content.
//
//	rocksdump DIR
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	rocks "github.com/jgraettinger/gorocksdb"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: rocksdump DIR")
		os.Exit(2)
	}
	var opts = rocks.NewDefaultOptions()
	opts.SetCreateIfMissing(false)
	// Opened for writing, as a recovered shard's store is: RocksDB replays the WAL and
	// writes a new MANIFEST of its own.
	var db, err = rocks.OpenDb(opts, os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "rocksdump: opening %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	defer db.Close()

	var ro = rocks.NewDefaultReadOptions()
	var it = db.NewIterator(ro)
	defer it.Close()
	var out = make(map[string]string)
	for it.SeekToFirst(); it.Valid(); it.Next() {
		var k, v = it.Key(), it.Value()
		out[hex.EncodeToString(k.Data())] = hex.EncodeToString(v.Data())
		k.Free()
		v.Free()
	}
	if err = it.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "rocksdump: iterating %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	if err = json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "rocksdump: %v\n", err)
		os.Exit(1)
	}
}
