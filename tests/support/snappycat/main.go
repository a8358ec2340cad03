// snappycat decompresses the snappy framing format from stdin to stdout, with
// golang/snappy's Reader: the library Gazette reads SNAPPY fragments with.
package main

import (
	"io"
	"os"

	"github.com/golang/snappy"
)

func main() {
	if _, err := io.Copy(os.Stdout, snappy.NewReader(os.Stdin)); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
}
