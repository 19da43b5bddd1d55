package chunk

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// Events.
//
// With Config.Logger set, the pool reports what it does on its slow paths as
// structured log records (log/slog), one per operation, never per chunk
// handed out from the cache. The messages are the Event constants; the
// attributes are listed with each. Sizes are in bytes, durations are
// time.Duration values. Without a logger the cost is a nil check.

// Messages of the pool's log records.
const (
	// EventScrub: chunks were cleared for a new tenant (Debug). Attributes:
	// at (the first chunk's address), chunks, fresh, moved, queued.
	EventScrub = "pool.scrub"
	// EventRelieve: a growth (or an Acquire) found no room and relieved the pressure
	// (Debug). Attributes: need and freed (units of the pool's tail size:
	// chunks on a pool of one size), reclaimed (chunks from members),
	// peer_trimmed (chunks freed by other pools on the device), cause
	// ("budget" or "device"), dur.
	EventRelieve = "pool.relieve"
	// EventDeviceSync: a release waited for the whole device before it
	// unmapped (Debug). Attributes: dur, and err when the wait failed.
	EventDeviceSync = "pool.device_sync"
	// EventRelease: chunks that waited for the device were unmapped once
	// their events completed and went back to the cache (Debug). Attributes:
	// chunks, failed.
	EventRelease = "pool.release"
	// EventOOM: an Acquire could not be served (Debug: the arena that asked
	// reports it at Warn). Attributes: asked (units of the pool's tail
	// size: chunks on a pool of one size), asked_bytes, held,
	// budget, in_use, cached, pending (chunks), err.
	EventOOM = "pool.oom"
)

// logOn reports whether the pool logs records at level.
func (p *Pool) logOn(level slog.Level) bool {
	return p.log != nil && p.log.Enabled(context.Background(), level)
}

func (p *Pool) emit(level slog.Level, msg string, attrs ...slog.Attr) {
	p.log.LogAttrs(context.Background(), level, msg, attrs...)
}

// logScrub reports the scrubs of a MapRange.
func (p *Pool) logScrub(at acl.DevicePtr, fresh, moved, queued int) {
	if fresh+moved == 0 || !p.logOn(slog.LevelDebug) {
		return
	}
	p.emit(slog.LevelDebug, EventScrub, slog.String("at", at.String()), slog.Int("chunks", fresh+moved),
		slog.Int("fresh", fresh), slog.Int("moved", moved), slog.Int("queued", queued))
}

// logRelieve reports a relief.
func (p *Pool) logRelieve(need, freed, reclaimed, peers int, short error, start time.Time) {
	if !p.logOn(slog.LevelDebug) {
		return
	}
	cause := "device"
	if errors.Is(short, ErrBudget) {
		cause = "budget"
	}
	p.emit(slog.LevelDebug, EventRelieve, slog.Int("need", need), slog.Int("freed", freed),
		slog.Int("reclaimed", reclaimed), slog.Int("peer_trimmed", peers), slog.String("cause", cause),
		slog.Duration("dur", time.Since(start)))
}

// logSync reports a device-wide wait.
func (p *Pool) logSync(start time.Time, err error) {
	if !p.logOn(slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{slog.Duration("dur", time.Since(start))}
	if err != nil {
		attrs = append(attrs, slog.Any("err", err))
	}
	p.emit(slog.LevelDebug, EventDeviceSync, attrs...)
}

// logRelease reports an unmapped batch of chunks that waited for the device.
func (p *Pool) logRelease(n, failed int) {
	if n+failed == 0 || !p.logOn(slog.LevelDebug) {
		return
	}
	p.emit(slog.LevelDebug, EventRelease, slog.Int("chunks", n), slog.Int("failed", failed))
}

// logOOM reports an Acquire of n units that failed for want of memory,
// with the view of the pool its error gives.
func (p *Pool) logOOM(n int, s Stats, err error) {
	if !p.logOn(slog.LevelDebug) {
		return
	}
	p.emit(slog.LevelDebug, EventOOM, slog.Int("asked", n), slog.Int64("asked_bytes", int64(n)*int64(p.tail)),
		slog.Int64("held", s.HeldBytes), slog.Int64("budget", s.Budget), slog.Int("in_use", s.InUse),
		slog.Int("cached", s.Cached), slog.Int("pending", s.Pending), slog.Any("err", err))
}
