// Package doclinks holds a test, and nothing else: every relative link in
// README.md and docs/ leads to a file that exists, and every #anchor to a
// heading of that file (as GitHub makes anchors). Links to other sites are
// not followed. Run it with go test ./internal/doclinks.
package doclinks
