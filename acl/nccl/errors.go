package nccl

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// Result is an ncclResult_t, the status every NCCL call returns.
type Result int32

// ncclResult_t values (nccl.h).
const (
	Success            Result = 0 // ncclSuccess
	UnhandledCudaError Result = 1 // ncclUnhandledCudaError: a CUDA call inside NCCL failed
	SystemError        Result = 2 // ncclSystemError
	InternalError      Result = 3 // ncclInternalError
	InvalidArgument    Result = 4 // ncclInvalidArgument
	InvalidUsage       Result = 5 // ncclInvalidUsage
	RemoteError        Result = 6 // ncclRemoteError
	InProgress         Result = 7 // ncclInProgress
)

var resultNames = map[Result]string{
	Success:            "ncclSuccess",
	UnhandledCudaError: "ncclUnhandledCudaError",
	SystemError:        "ncclSystemError",
	InternalError:      "ncclInternalError",
	InvalidArgument:    "ncclInvalidArgument",
	InvalidUsage:       "ncclInvalidUsage",
	RemoteError:        "ncclRemoteError",
	InProgress:         "ncclInProgress",
}

// String returns the nccl.h name of r, or "ncclResult_t(n)".
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("ncclResult_t(%d)", int32(r))
}

// ACLCode returns the aclError code an ncclResult_t is reported as, so that
// the acl sentinels classify NCCL failures: ncclInvalidArgument and
// ncclInvalidUsage are 107000 (ErrInvalidParam); anything else is 507899
// (no sentinel).
func ACLCode(r Result) int32 {
	switch r {
	case Success:
		return acl.Success
	case InvalidArgument, InvalidUsage:
		return acl.ErrCodeRTParamInvalid
	}
	return acl.ErrCodeRTDrvInternal
}

// Error is an NCCL call that failed: the function, its ncclResult_t, NCCL's
// description of it (ncclGetErrorString) and the communicator's last error
// (ncclGetLastError), when there is one. It unwraps to the *acl.Error the
// contract's callers branch on: Op is the NCCL function, Code is
// ACLCode(Result). A refusal the binding makes itself, before NCCL is
// called, is a plain *acl.Error with code 107000.
type Error struct {
	Func   string // e.g. "ncclCommRegister"
	Result Result
	Desc   string // ncclGetErrorString; may be empty
	Last   string // ncclGetLastError; may be empty
}

// ACL returns the *acl.Error e is reported as.
func (e *Error) ACL() *acl.Error {
	msg := fmt.Sprintf("%v (%d)", e.Result, int32(e.Result))
	if e.Desc != "" {
		msg += ": " + e.Desc
	}
	if e.Last != "" {
		msg += ": " + e.Last
	}
	return &acl.Error{Op: e.Func, Code: ACLCode(e.Result), Msg: msg}
}

// Error formats e as its *acl.Error does, e.g. "ncclCommDeregister:
// ACL_ERROR_RT_PARAM_INVALID (107000): ncclInvalidUsage (5): invalid usage".
func (e *Error) Error() string { return e.ACL().Error() }

// Unwrap returns the *acl.Error e is reported as.
func (e *Error) Unwrap() error { return e.ACL() }
