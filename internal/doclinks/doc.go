// Package doclinks holds tests, and nothing else: every relative link in
// README.md and docs/ leads to a file that exists, and every #anchor to a
// heading of that file (as GitHub makes anchors); links to other sites are
// not followed. And every Go block those pages mark as quoting declarations
// of a file of the repository (<!-- quote FILE NAME... -->) is those
// declarations, byte for byte (quote_test.go). Run them with go test
// ./internal/doclinks.
package doclinks
