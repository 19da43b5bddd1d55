package ascend

import "github.com/vmarena/vmarena/acl"

// PrivateStreams returns how many streams the driver's device holds for the
// driver's own use (the copy stream): they are live in the runtime but not in
// the books.
func PrivateStreams(d *Driver) int {
	d.dev.streamMu.Lock()
	defer d.dev.streamMu.Unlock()
	if d.dev.stream != 0 {
		return 1
	}
	return 0
}

// Users returns how many calls in progress hold the stream s and the event
// ev in d's books.
func Users(d *Driver, s acl.Stream, ev acl.Event) (streamUsers, eventUsers int) {
	d.books.mu.Lock()
	defer d.books.mu.Unlock()
	if o, ok := d.books.streams[s]; ok {
		streamUsers = o.users
	}
	if o, ok := d.books.events[ev]; ok {
		eventUsers = o.users
	}
	return streamUsers, eventUsers
}

// RawStream creates a stream with the runtime directly (aclrtCreateStream),
// behind the books, as the caller's own CANN code would, on a thread with
// the device's context current. destroy destroys it the same way.
func RawStream(d *Driver) (s acl.Stream, destroy func() error, err error) {
	err = d.on("aclrtCreateStream", func() error {
		return d.check("aclrtCreateStream", d.lib.fns.createStream(&s))
	})
	if err != nil {
		return 0, nil, err
	}
	return s, func() error {
		return d.on("aclrtDestroyStream", func() error {
			return d.check("aclrtDestroyStream", d.lib.fns.destroyStream(s))
		})
	}, nil
}
