package cuda

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// Result is a CUresult, the status every CUDA driver call returns.
type Result int32

// CUresult values the binding gives a meaning to (cuda.h).
const (
	ResultSuccess              Result = 0   // CUDA_SUCCESS
	ResultInvalidValue         Result = 1   // CUDA_ERROR_INVALID_VALUE
	ResultOutOfMemory          Result = 2   // CUDA_ERROR_OUT_OF_MEMORY
	ResultNotInitialized       Result = 3   // CUDA_ERROR_NOT_INITIALIZED
	ResultDeinitialized        Result = 4   // CUDA_ERROR_DEINITIALIZED
	ResultStubLibrary          Result = 34  // CUDA_ERROR_STUB_LIBRARY: the toolkit's stub, not a driver
	ResultDeviceUnavailable    Result = 46  // CUDA_ERROR_DEVICE_UNAVAILABLE
	ResultNoDevice             Result = 100 // CUDA_ERROR_NO_DEVICE
	ResultInvalidDevice        Result = 101 // CUDA_ERROR_INVALID_DEVICE
	ResultInvalidContext       Result = 201 // CUDA_ERROR_INVALID_CONTEXT
	ResultAlreadyMapped        Result = 208 // CUDA_ERROR_ALREADY_MAPPED
	ResultNotMapped            Result = 211 // CUDA_ERROR_NOT_MAPPED
	ResultInvalidHandle        Result = 400 // CUDA_ERROR_INVALID_HANDLE
	ResultNotReady             Result = 600 // CUDA_ERROR_NOT_READY: work queued before it has not finished (a query's answer, not a failure)
	ResultIllegalAddress       Result = 700 // CUDA_ERROR_ILLEGAL_ADDRESS
	ResultNotPermitted         Result = 800 // CUDA_ERROR_NOT_PERMITTED
	ResultNotSupported         Result = 801 // CUDA_ERROR_NOT_SUPPORTED
	ResultSystemDriverMismatch Result = 803 // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
	ResultUnknown              Result = 999 // CUDA_ERROR_UNKNOWN
)

var resultNames = map[Result]string{
	ResultSuccess:              "CUDA_SUCCESS",
	ResultInvalidValue:         "CUDA_ERROR_INVALID_VALUE",
	ResultOutOfMemory:          "CUDA_ERROR_OUT_OF_MEMORY",
	ResultNotInitialized:       "CUDA_ERROR_NOT_INITIALIZED",
	ResultDeinitialized:        "CUDA_ERROR_DEINITIALIZED",
	ResultStubLibrary:          "CUDA_ERROR_STUB_LIBRARY",
	ResultDeviceUnavailable:    "CUDA_ERROR_DEVICE_UNAVAILABLE",
	ResultNoDevice:             "CUDA_ERROR_NO_DEVICE",
	ResultInvalidDevice:        "CUDA_ERROR_INVALID_DEVICE",
	ResultInvalidContext:       "CUDA_ERROR_INVALID_CONTEXT",
	ResultAlreadyMapped:        "CUDA_ERROR_ALREADY_MAPPED",
	ResultNotMapped:            "CUDA_ERROR_NOT_MAPPED",
	ResultInvalidHandle:        "CUDA_ERROR_INVALID_HANDLE",
	ResultNotReady:             "CUDA_ERROR_NOT_READY",
	ResultIllegalAddress:       "CUDA_ERROR_ILLEGAL_ADDRESS",
	ResultNotPermitted:         "CUDA_ERROR_NOT_PERMITTED",
	ResultNotSupported:         "CUDA_ERROR_NOT_SUPPORTED",
	ResultSystemDriverMismatch: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	ResultUnknown:              "CUDA_ERROR_UNKNOWN",
}

// String returns the cuda.h name of r, such as "CUDA_ERROR_OUT_OF_MEMORY",
// or "CUresult(n)" for a value this package does not name. It works without
// the driver; errors from a loaded driver carry the driver's own name.
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", int32(r))
}

// ACLCode returns the aclError code a CUresult is reported as, so that the
// acl sentinels classify CUDA failures:
//
//	CUDA_ERROR_INVALID_VALUE, ALREADY_MAPPED   107000 ACL_ERROR_RT_PARAM_INVALID    ErrInvalidParam
//	CUDA_ERROR_OUT_OF_MEMORY                   207001 ACL_ERROR_RT_MEMORY_ALLOCATION ResultOutOfMemory
//	CUDA_ERROR_STUB_LIBRARY, NOT_SUPPORTED,
//	  SYSTEM_DRIVER_MISMATCH                   207000 ACL_ERROR_RT_FEATURE_NOT_SUPPORT ResultNotSupported
//	CUDA_ERROR_INVALID_CONTEXT                 107002 ACL_ERROR_RT_CONTEXT_NULL      ErrNoContext
//	CUDA_ERROR_INVALID_DEVICE                  107001 ACL_ERROR_RT_INVALID_DEVICEID  ResultNoDevice
//	CUDA_ERROR_NO_DEVICE                       207004 ACL_ERROR_RT_NO_DEVICE         ResultNoDevice
//	CUDA_ERROR_INVALID_HANDLE                  107017 ACL_ERROR_RT_INVALID_HANDLE    ResultInvalidHandle
//	CUDA_ERROR_NOT_PERMITTED                   207006 ACL_ERROR_RT_NO_PERMISSION
//	anything else (NOT_MAPPED, NOT_READY,
//	  ILLEGAL_ADDRESS, NOT_INITIALIZED,
//	  UNKNOWN, …)                              507899 ACL_ERROR_RT_DRV_INTERNAL_ERROR
//
// ACLCode(ResultSuccess) is acl.Success.
func ACLCode(r Result) int32 {
	switch r {
	case ResultSuccess:
		return acl.Success
	case ResultInvalidValue, ResultAlreadyMapped:
		return acl.ErrCodeRTParamInvalid
	case ResultOutOfMemory:
		return acl.ErrCodeRTMemoryAllocation
	case ResultStubLibrary, ResultNotSupported, ResultSystemDriverMismatch:
		return acl.ErrCodeRTFeatureNotSupport
	case ResultInvalidContext:
		return acl.ErrCodeRTContextNull
	case ResultInvalidDevice:
		return acl.ErrCodeRTInvalidDeviceID
	case ResultNoDevice:
		return acl.ErrCodeRTNoDevice
	case ResultInvalidHandle:
		return acl.ErrCodeRTInvalidHandle
	case ResultNotPermitted:
		return acl.ErrCodeRTNoPermission
	}
	return acl.ErrCodeRTDrvInternal
}

// Error is a CUDA driver call that failed. It keeps the raw CUresult and
// the driver's name and description of it, and unwraps to the *acl.Error
// the driver contract promises: Op is the CUDA function, Code is
// ACLCode(Result) and Msg holds the CUDA name, number and description. So
// errors.As(err, new(*acl.Error)), errors.Is(err, acl.ErrOutOfMemory) and
// errors.As(err, new(*cuda.Error)) all work on what the Driver returns.
//
// Failures the binding detects itself, before calling CUDA (the ACL rules
// CUDA does not enforce), are plain *acl.Error values whose Op is the ACL
// function the method stands for, such as "aclrtMapMem".
type Error struct {
	Func   string // the CUDA function, e.g. "cuMemMap"
	Result Result // what it returned
	Name   string // cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Desc   string // cuGetErrorString, e.g. "out of memory"; may be empty
}

// ACL returns the *acl.Error e is reported as.
func (e *Error) ACL() *acl.Error {
	name := e.Name
	if name == "" {
		name = e.Result.String()
	}
	msg := fmt.Sprintf("%s (%d)", name, int32(e.Result))
	if e.Desc != "" {
		msg += ": " + e.Desc
	}
	return &acl.Error{Op: e.Func, Code: ACLCode(e.Result), Msg: msg}
}

// Error formats e as its *acl.Error does, e.g. "cuMemCreate:
// ACL_ERROR_RT_MEMORY_ALLOCATION (207001): CUDA_ERROR_OUT_OF_MEMORY (2): out
// of memory".
func (e *Error) Error() string { return e.ACL().Error() }

// Unwrap returns the *acl.Error e is reported as.
func (e *Error) Unwrap() error { return e.ACL() }

// newError returns the error for fn returning r, named by the library's own
// cuGetErrorName/cuGetErrorString, or nil for CUDA_SUCCESS. It needs no
// context.
func (l *library) newError(fn string, r Result) error {
	if r == ResultSuccess {
		return nil
	}
	e := &Error{Func: fn, Result: r}
	var p *byte
	if l.cuGetErrorName(r, &p) == ResultSuccess {
		e.Name = goString(p)
	}
	p = nil
	if l.cuGetErrorString(r, &p) == ResultSuccess {
		e.Desc = goString(p)
	}
	return e
}
