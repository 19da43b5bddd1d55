package ascend

import (
	"errors"

	"github.com/vmarena/vmarena/acl"
)

// Streams and events.
//
// An acl.Stream or acl.Event of this driver is the runtime's own handle (the
// aclrtStream or aclrtEvent pointer), so that a caller can hand a stream it
// created here to the code that launches its kernels, as it is, and pass the
// driver a stream its own CANN code created. 0 is the default stream (NULL in
// ACL). The calls that only use a stream (RecordEvent, MemsetAsync,
// SynchronizeStream) take any stream but one this driver destroyed: a
// foreign one is passed to the runtime as it is. Only the streams the driver
// created can be destroyed through it. Events are the driver's own: it
// accepts only the events in its books. See books for why.

// CreateStream is aclrtCreateStream.
func (d *Driver) CreateStream() (acl.Stream, error) {
	const op = "aclrtCreateStream"
	var s acl.Stream
	err := d.on(op, func() error {
		if err := d.check(op, d.lib.fns.createStream(&s)); err != nil {
			return err
		}
		if s == 0 {
			return acl.Errorf(op, acl.ErrCodeRTInternal, "the runtime returned a NULL stream")
		}
		d.books.addStream(s)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return s, nil
}

// DestroyStream is aclrtDestroyStream, for a stream this driver created. It
// refuses, with 107000, a stream that has work pending (synchronise it
// first), that another call is using, that it destroyed already, or that it
// did not create (a foreign stream: its owner destroys it); and the default
// stream with 100000, as ACL does.
//
// ACL requires an idle stream but does not check it: the driver asks
// aclrtStreamQuery where the runtime has it, and otherwise records a private
// event on the stream and queries it. A runtime with neither cannot tell, and
// the stream is destroyed as asked.
func (d *Driver) DestroyStream(s acl.Stream) error {
	const op = "aclrtDestroyStream"
	return d.on(op, func() error {
		if s == 0 {
			return acl.Errorf(op, acl.ErrCodeInvalidParam, "the default stream (NULL) cannot be destroyed")
		}
		done, err := d.books.claimStream(op, s)
		if err != nil {
			return err
		}
		destroyed := false
		defer func() { done(destroyed) }()
		pending, err := d.pending(s)
		if err != nil {
			return err
		}
		if pending {
			return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "stream %#x has work pending: synchronise it first", uintptr(s))
		}
		if err := d.check(op, d.lib.fns.destroyStream(s)); err != nil {
			return err
		}
		destroyed = true
		return nil
	})
}

// pending reports whether work queued on s has not run yet, or false when
// the runtime cannot tell. It runs inside on.
func (d *Driver) pending(s acl.Stream) (bool, error) {
	if query, err := d.lib.streamQuery.get(d.lib, "aclrtStreamQuery"); err == nil {
		status := streamStatusComplete
		if err := d.check("aclrtStreamQuery", query(s, &status)); err != nil {
			return false, err
		}
		return status == streamStatusNotReady, nil
	}
	ev, err := d.lib.events.get(d.lib)
	if err != nil {
		return false, nil
	}
	var e acl.Event
	if err := d.check("aclrtCreateEvent", ev.create(&e)); err != nil {
		return false, err
	}
	status := eventRecordedComplete
	err = d.check("aclrtRecordEvent", ev.record(e, s))
	if err == nil {
		err = d.check("aclrtQueryEventStatus", ev.query(e, &status))
	}
	if derr := d.check("aclrtDestroyEvent", ev.destroy(e)); derr != nil {
		err = errors.Join(err, derr)
	}
	if err != nil {
		return false, err
	}
	return status != eventRecordedComplete, nil
}

// SynchronizeStream is aclrtSynchronizeStream: it waits for the work queued
// on s (0: the default stream; a foreign stream is passed as it is) and
// returns the error of work that failed on it, such as a kernel that touched
// unmapped memory.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	const op = "aclrtSynchronizeStream"
	return d.on(op, func() error {
		release, err := d.books.useStream(op, s)
		if err != nil {
			return err
		}
		defer release()
		return d.check(op, d.lib.fns.synchronizeStream(s))
	})
}

// SynchronizeDevice is aclrtSynchronizeDevice: it waits until every stream of
// the device has drained, in this process. It stalls all the process's work
// on the NPU; vmarena uses it only where no event orders an unmap.
func (d *Driver) SynchronizeDevice() error {
	const op = "aclrtSynchronizeDevice"
	return d.on(op, func() error {
		return d.check(op, d.lib.fns.synchronizeDevice())
	})
}

// eventFns returns the event calls, or an error matching acl.ErrNotSupported
// that names the symbols the runtime lacks. It runs inside on.
func (d *Driver) eventFns(op string) (*eventFuncs, error) {
	ev, err := d.lib.events.get(d.lib)
	if err != nil {
		return nil, acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport, "no events: %v", err)
	}
	return ev, nil
}

// CreateEvent is aclrtCreateEvent: an event without flags, which is all that
// recording and querying need. On a runtime that lacks any of the event
// calls (aclrtCreateEvent, aclrtRecordEvent, aclrtQueryEventStatus,
// aclrtSynchronizeEvent, aclrtDestroyEvent) every event method fails with
// 207000, matching acl.ErrNotSupported, naming the missing ones.
func (d *Driver) CreateEvent() (acl.Event, error) {
	const op = "aclrtCreateEvent"
	var ev acl.Event
	err := d.on(op, func() error {
		fns, err := d.eventFns(op)
		if err != nil {
			return err
		}
		if err := d.check(op, fns.create(&ev)); err != nil {
			return err
		}
		if ev == 0 {
			return acl.Errorf(op, acl.ErrCodeRTInternal, "the runtime returned a NULL event")
		}
		d.books.addEvent(ev)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return ev, nil
}

// RecordEvent is aclrtRecordEvent: it marks the present end of s's queue (0:
// the default stream; a foreign stream is passed as it is) with ev.
func (d *Driver) RecordEvent(ev acl.Event, s acl.Stream) error {
	const op = "aclrtRecordEvent"
	return d.on(op, func() error {
		fns, err := d.eventFns(op)
		if err != nil {
			return err
		}
		releaseEv, err := d.books.useEvent(op, ev)
		if err != nil {
			return err
		}
		defer releaseEv()
		releaseS, err := d.books.useStream(op, s)
		if err != nil {
			return err
		}
		defer releaseS()
		return d.check(op, fns.record(ev, s))
	})
}

// QueryEvent is aclrtQueryEventStatus: true once the work queued before ev's
// last record has run (ACL_EVENT_RECORDED_STATUS_COMPLETE). An event never
// recorded reports false. It never waits.
func (d *Driver) QueryEvent(ev acl.Event) (bool, error) {
	const op = "aclrtQueryEventStatus"
	status := eventRecordedNotReady
	err := d.on(op, func() error {
		fns, err := d.eventFns(op)
		if err != nil {
			return err
		}
		release, err := d.books.useEvent(op, ev)
		if err != nil {
			return err
		}
		defer release()
		return d.check(op, fns.query(ev, &status))
	})
	if err != nil {
		return false, err
	}
	return status == eventRecordedComplete, nil
}

// SynchronizeEvent is aclrtSynchronizeEvent: it waits until ev completes. For
// an event never recorded it returns at once.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	const op = "aclrtSynchronizeEvent"
	return d.on(op, func() error {
		fns, err := d.eventFns(op)
		if err != nil {
			return err
		}
		release, err := d.books.useEvent(op, ev)
		if err != nil {
			return err
		}
		defer release()
		return d.check(op, fns.sync(ev))
	})
}

// DestroyEvent is aclrtDestroyEvent. It refuses, with 107000, an event that
// another call (SynchronizeEvent, say) is using, or that is not live, and
// NULL with 100000.
func (d *Driver) DestroyEvent(ev acl.Event) error {
	const op = "aclrtDestroyEvent"
	return d.on(op, func() error {
		fns, err := d.eventFns(op)
		if err != nil {
			return err
		}
		done, err := d.books.claimEvent(op, ev)
		if err != nil {
			return err
		}
		destroyed := false
		defer func() { done(destroyed) }()
		if err := d.check(op, fns.destroy(ev)); err != nil {
			return err
		}
		destroyed = true
		return nil
	})
}

// MemsetAsync is aclrtMemsetAsync(ptr, n, value, n, s): it queues a memset
// on s (0: the default stream; a foreign stream is passed as it is) and
// returns. The range must stay mapped until the memset has run. A runtime
// without aclrtMemsetAsync fails with 207000.
func (d *Driver) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	const op = "aclrtMemsetAsync"
	if n == 0 {
		return nil
	}
	return d.on(op, func() error {
		fn, err := d.lib.memsetAsync.get(d.lib, op)
		if err != nil {
			return acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport, "%v", err)
		}
		release, err := d.books.useStream(op, s)
		if err != nil {
			return err
		}
		defer release()
		return d.check(op, fn(ptr, n, int32(value), n, s))
	})
}
