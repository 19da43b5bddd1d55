// Package logtest records the log/slog events of the packages under test, so
// that their tests can check what was reported, at which level and with
// which attributes.
package logtest

import (
	"context"
	"log/slog"
	"sync"
)

// Recorder is a slog.Handler that keeps every record at every level. It is
// safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	recs []Record
}

// Record is one event: its level, its message and its attributes by key.
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]slog.Value
}

// Enabled reports true: a Recorder keeps every level.
func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps rc.
func (r *Recorder) Handle(_ context.Context, rc slog.Record) error {
	m := make(map[string]slog.Value)
	rc.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value
		return true
	})
	r.mu.Lock()
	r.recs = append(r.recs, Record{rc.Level, rc.Message, m})
	r.mu.Unlock()
	return nil
}

// WithAttrs returns r: the tests look at each record's own attributes.
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

// WithGroup returns r.
func (r *Recorder) WithGroup(string) slog.Handler { return r }

// Find returns the records with message msg, oldest first.
func (r *Recorder) Find(msg string) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Record
	for _, rc := range r.recs {
		if rc.Msg == msg {
			out = append(out, rc)
		}
	}
	return out
}
