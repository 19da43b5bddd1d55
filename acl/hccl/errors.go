package hccl

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// Result is an HcclResult, the status every HCCL call returns.
type Result int32

// HcclResult values (hccl_types.h).
const (
	Success        Result = 0  // HCCL_SUCCESS
	ErrPara        Result = 1  // HCCL_E_PARA: a parameter was rejected
	ErrPtr         Result = 2  // HCCL_E_PTR: a NULL pointer
	ErrMemory      Result = 3  // HCCL_E_MEMORY
	ErrInternal    Result = 4  // HCCL_E_INTERNAL
	ErrNotSupport  Result = 5  // HCCL_E_NOT_SUPPORT: the chip or the release lacks the feature
	ErrNotFound    Result = 6  // HCCL_E_NOT_FOUND
	ErrUnavail     Result = 7  // HCCL_E_UNAVAIL
	ErrTimeout     Result = 9  // HCCL_E_TIMEOUT
	ErrTCPTransfer Result = 13 // HCCL_E_TCP_TRANSFER: the peers did not answer in time
	ErrRuntime     Result = 15 // HCCL_E_RUNTIME: an ACL runtime call inside HCCL failed
	ErrDrv         Result = 16 // HCCL_E_DRV
	ErrAgain       Result = 20 // HCCL_E_AGAIN
	ErrOOM         Result = 24 // HCCL_E_OOM
)

var resultNames = map[Result]string{
	Success:        "HCCL_SUCCESS",
	ErrPara:        "HCCL_E_PARA",
	ErrPtr:         "HCCL_E_PTR",
	ErrMemory:      "HCCL_E_MEMORY",
	ErrInternal:    "HCCL_E_INTERNAL",
	ErrNotSupport:  "HCCL_E_NOT_SUPPORT",
	ErrNotFound:    "HCCL_E_NOT_FOUND",
	ErrUnavail:     "HCCL_E_UNAVAIL",
	ErrTimeout:     "HCCL_E_TIMEOUT",
	ErrTCPTransfer: "HCCL_E_TCP_TRANSFER",
	ErrRuntime:     "HCCL_E_RUNTIME",
	ErrDrv:         "HCCL_E_DRV",
	ErrAgain:       "HCCL_E_AGAIN",
	ErrOOM:         "HCCL_E_OOM",
}

// String returns the hccl_types.h name of r, or "HcclResult(n)".
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("HcclResult(%d)", int32(r))
}

// ACLCode returns the aclError code an HcclResult is reported as, so that
// the acl sentinels classify HCCL failures:
//
//	HCCL_E_PARA, HCCL_E_PTR        107000 ErrInvalidParam
//	HCCL_E_NOT_SUPPORT             207000 ErrNotSupported
//	HCCL_E_MEMORY, HCCL_E_OOM      207001 ErrOutOfMemory
//	HCCL_E_NOT_FOUND               107017 ErrInvalidHandle
//	anything else                  507899 (no sentinel)
func ACLCode(r Result) int32 {
	switch r {
	case Success:
		return acl.Success
	case ErrPara, ErrPtr:
		return acl.ErrCodeRTParamInvalid
	case ErrNotSupport:
		return acl.ErrCodeRTFeatureNotSupport
	case ErrMemory, ErrOOM:
		return acl.ErrCodeRTMemoryAllocation
	case ErrNotFound:
		return acl.ErrCodeRTInvalidHandle
	}
	return acl.ErrCodeRTDrvInternal
}

// Error is an HCCL call that failed: the function, its HcclResult and
// HCCL's description of it (HcclGetErrorString). It unwraps to the
// *acl.Error the contract's callers branch on: Op is the HCCL function,
// Code is ACLCode(Result). A refusal the binding makes itself, before HCCL
// is called, is a plain *acl.Error with code 107000.
type Error struct {
	Func   string // e.g. "HcclCommActivateCommMemory"
	Result Result
	Desc   string // HcclGetErrorString; may be empty
}

// ACL returns the *acl.Error e is reported as.
func (e *Error) ACL() *acl.Error {
	msg := fmt.Sprintf("%v (%d)", e.Result, int32(e.Result))
	if e.Desc != "" && e.Desc != e.Result.String() {
		msg += ": " + e.Desc
	}
	return &acl.Error{Op: e.Func, Code: ACLCode(e.Result), Msg: msg}
}

// Error formats e as its *acl.Error does, e.g. "HcclCommActivateCommMemory:
// ACL_ERROR_RT_PARAM_INVALID (107000): HCCL_E_PARA (1)".
func (e *Error) Error() string { return e.ACL().Error() }

// Unwrap returns the *acl.Error e is reported as.
func (e *Error) Unwrap() error { return e.ACL() }
