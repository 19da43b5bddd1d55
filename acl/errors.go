package acl

import (
	"errors"
	"fmt"
)

// Sentinels that callers branch on. An [*Error] matches the one for its code
// under errors.Is; other packages wrap these with %w.
var (
	// ErrOutOfMemory: the device (or a budget in front of it) has no memory
	// for the request. ACL code 207001 (and 207018, 200000).
	ErrOutOfMemory = errors.New("out of device memory")
	// ErrInvalidParam: an argument was rejected. ACL codes 100000, 107000,
	// 107008, 200003.
	ErrInvalidParam = errors.New("invalid parameter")
	// ErrInvalidHandle: a physical handle or address is not known to the
	// driver. ACL codes 107017, 200005.
	ErrInvalidHandle = errors.New("invalid handle")
	// ErrNotSupported: the runtime, driver or chip lacks the feature, or the
	// runtime is not installed. ACL codes 207000, 200001, 200006.
	ErrNotSupported = errors.New("not supported")
	// ErrNoContext: the calling thread has no current device. ACL code 107002.
	ErrNoContext = errors.New("no current device context")
	// ErrNoDevice: the device does not exist. ACL codes 107001, 207004, 200002.
	ErrNoDevice = errors.New("no such device")
)

// Error is a failed driver call: the ACL function, its aclError code and the
// runtime's message (aclGetRecentErrMsg), when there is one.
type Error struct {
	Op   string // ACL function, e.g. "aclrtMapMem"
	Code int32  // aclError
	Msg  string // the runtime's explanation; may be empty
}

// NewError returns the error for a failed call of op with code and message.
// It returns nil when code is ACL_SUCCESS.
func NewError(op string, code int32, msg string) error {
	if code == Success {
		return nil
	}
	return &Error{Op: op, Code: code, Msg: msg}
}

// Errorf is NewError with a formatted message.
func Errorf(op string, code int32, format string, args ...any) error {
	return NewError(op, code, fmt.Sprintf(format, args...))
}

// Error formats e as "op: NAME (code): message".
func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%d)", e.Op, CodeName(e.Code), e.Code)
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Is reports whether e belongs to the class of target, one of the sentinels
// of this package.
func (e *Error) Is(target error) bool {
	s := sentinelOf(e.Code)
	return s != nil && s == target
}

// CodeOf returns the ACL code carried by err, and whether it carries one.
func CodeOf(err error) (int32, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Code, true
	}
	return 0, false
}
