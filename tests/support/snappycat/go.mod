module pygazette.test/snappycat

go 1.21

require github.com/golang/snappy v1.0.0
