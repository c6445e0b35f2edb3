!> cairn -- the Fortran interface of cairn, a model cache for HPC deep-learning workflows.
!!
!! A thin layer over the C API (include/cairn/cairn.h) with ISO_C_BINDING; docs/fortran.md is the
!! user's guide. Conventions (they hold for every procedure):
!!  - Every procedure that can fail is a function returning an integer(enum_kind) status code:
!!    CAIRN_OK (0) on success, else one of the CAIRN_ERR_* constants (the C API's, same values).
!!    cairn_last_error() then describes the failure (thread-local, until the next cairn call).
!!  - Names follow the C API's rule (cairn.h): the C name without "cairn_" and without the object
!!    the type stands for (cairn_tensor_put -> client%tensor_put, cairn_model_commit_opts ->
!!    writer%commit, cairn_ticket_wait -> ticket%wait). The named-tensor calls also keep the names of
!!    SmartRedis's Fortran client, as the same procedures: client_type with initialize, destructor,
!!    put_tensor(name, data, dims), unpack_tensor(name, result, dims), get_tensor_info,
!!    poll_tensor(name, poll_frequency_ms, num_tries, exists), tensor_exists, delete_tensor.
!!  - Layout: a Fortran array of shape (n1, n2, ..., nk) is stored, without a copy, as the row-major
!!    tensor of shape (nk, ..., n2, n1) -- the same bytes in the same order. C and numpy see the
!!    transpose (numpy: the stored array is a.T); Fortran reads it back as the same array. Element
!!    a(i1, ..., ik) is the tensor's element [ik-1, ..., i1-1]. unpack_tensor and read_tensor check
!!    that the array's kind and shape are the tensor's (reversed), so a read is always exact.
!!  - Arrays of real32, real64, int32 and int64 (the C kinds c_float, c_double, c_int32_t,
!!    c_int64_t) of rank 0 to 8 (CAIRN_MAX_DIMS) are accepted; non-contiguous sections are copied
!!    in and out by the compiler.
!!  - Strings (keys, model ids, tensor names) lose trailing blanks, as in SmartRedis.
!!  - The derived types hold C handles. Copying a variable copies the handle, not the connection, and
!!    there are no finalizers: end each handle yourself (client%destructor, writer%commit or
!!    writer%abort, reader%close, ticket%free). As in C, a client is used by one thread at a time,
!!    and its readers and writers are finished before it is disconnected.
module cairn
  use, intrinsic :: iso_c_binding, only: c_ptr, c_null_ptr, c_null_char, c_char, c_int, c_int32_t, &
       c_int64_t, c_float, c_double, c_size_t, c_bool, c_loc, c_f_pointer, c_associated
  implicit none
  private

  !> The kind of the status codes and enumerations (a C enum), as in SmartRedis.
  integer, parameter, public :: enum_kind = c_int

  ! CAIRN_OK, CAIRN_ERR_NOT_FOUND, ...: generated from include/cairn/status_codes.h by CMake.
  include 'cairn_status_codes.inc'

  !> cairn_dtype (the values are the C ABI). get_tensor_info and tensor_info return one of these.
  integer(enum_kind), parameter, public :: CAIRN_DTYPE_F64 = 0, CAIRN_DTYPE_F32 = 1, CAIRN_DTYPE_F16 = 2, &
       CAIRN_DTYPE_BF16 = 3, CAIRN_DTYPE_F8_E4M3 = 4, CAIRN_DTYPE_F8_E5M2 = 5, CAIRN_DTYPE_I64 = 6, &
       CAIRN_DTYPE_I32 = 7, CAIRN_DTYPE_I16 = 8, CAIRN_DTYPE_I8 = 9, CAIRN_DTYPE_U64 = 10, &
       CAIRN_DTYPE_U32 = 11, CAIRN_DTYPE_U16 = 12, CAIRN_DTYPE_U8 = 13, CAIRN_DTYPE_BOOL = 14
  !> cairn_durability: how far writer%commit must have gone before it is acknowledged.
  integer(enum_kind), parameter, public :: CAIRN_DURABILITY_MEMORY = 0, CAIRN_DURABILITY_LOCAL = 1, &
       CAIRN_DURABILITY_GLOBAL = 2
  integer, parameter, public :: CAIRN_MAX_DIMS = 8

  integer(enum_kind), parameter :: kMemHost = 0
  character(len=*), parameter :: kDtypeNames(0:14) = [character(len=7) :: 'F64', 'F32', 'F16', 'BF16', &
       'F8_E4M3', 'F8_E5M2', 'I64', 'I32', 'I16', 'I8', 'U64', 'U32', 'U16', 'U8', 'BOOL']

  public :: cairn_status_string, cairn_last_error

  !> A connection to the node's cairnd (cairn_client).
  type, public :: client_type
    private
    type(c_ptr) :: handle = c_null_ptr
  contains
    !> code = client%initialize([address]): connects; no address (or '') means $CAIRN_SOCKET, then
    !! ${XDG_RUNTIME_DIR:-/tmp}/cairn-$UID/cairnd.sock. connect is the same procedure.
    procedure :: initialize => client_initialize
    procedure :: connect => client_initialize
    !> code = client%destructor(): disconnects (always CAIRN_OK). disconnect is the same procedure.
    procedure :: destructor => client_disconnect
    procedure :: disconnect => client_disconnect
    procedure :: isinitialized => client_isinitialized
    procedure :: address => client_address
    !> code = client%put_tensor(name, data [, dims]): stores (or replaces) a named tensor.
    generic :: put_tensor => put_tensor_float, put_tensor_double, put_tensor_i32, put_tensor_i64
    !> code = client%unpack_tensor(name, result [, dims]): copies a named tensor into result.
    generic :: unpack_tensor => unpack_tensor_float, unpack_tensor_double, unpack_tensor_i32, &
         unpack_tensor_i64
    procedure :: get_tensor_info => client_get_tensor_info
    !> code = client%poll_tensor(name, poll_frequency_ms, num_tries, exists)
    generic :: poll_tensor => poll_tensor_logical, poll_tensor_c_bool
    !> code = client%tensor_exists(name, exists)
    generic :: tensor_exists => tensor_exists_logical, tensor_exists_c_bool
    procedure :: delete_tensor => client_delete_tensor
    !> The names of the C API's rule (cairn_tensor_put -> client%tensor_put, ...), the same
    !! procedures as the SmartRedis names above: tensor_put, tensor_unpack, tensor_info, tensor_poll,
    !! tensor_delete.
    generic :: tensor_put => put_tensor_float, put_tensor_double, put_tensor_i32, put_tensor_i64
    generic :: tensor_unpack => unpack_tensor_float, unpack_tensor_double, unpack_tensor_i32, &
         unpack_tensor_i64
    procedure :: tensor_info => client_get_tensor_info
    generic :: tensor_poll => poll_tensor_logical, poll_tensor_c_bool
    procedure :: tensor_delete => client_delete_tensor
    !> code = client%model_prefetch(id [, all]): cairn_model_prefetch; all: every member of the
    !! job's peer group too. prefetch(id) is the same without all.
    procedure :: model_prefetch => client_model_prefetch
    procedure :: prefetch => client_prefetch
    procedure :: pipeline_flush => client_pipeline_flush
    procedure :: query => client_query
    procedure :: request => client_request
    procedure, private :: put_tensor_float => client_put_tensor_float
    procedure, private :: put_tensor_double => client_put_tensor_double
    procedure, private :: put_tensor_i32 => client_put_tensor_i32
    procedure, private :: put_tensor_i64 => client_put_tensor_i64
    procedure, private :: unpack_tensor_float => client_unpack_tensor_float
    procedure, private :: unpack_tensor_double => client_unpack_tensor_double
    procedure, private :: unpack_tensor_i32 => client_unpack_tensor_i32
    procedure, private :: unpack_tensor_i64 => client_unpack_tensor_i64
    procedure, private :: poll_tensor_logical => client_poll_tensor_logical
    procedure, private :: poll_tensor_c_bool => client_poll_tensor_c_bool
    procedure, private :: tensor_exists_logical => client_tensor_exists_logical
    procedure, private :: tensor_exists_c_bool => client_tensor_exists_c_bool
  end type client_type

  !> A commit's ticket (cairn_ticket): wait for the durability asked for, then free it.
  type, public :: ticket_type
    private
    type(c_ptr) :: handle = c_null_ptr
  contains
    procedure :: wait => ticket_wait
    procedure :: free => ticket_free
  end type ticket_type

  !> A model being written (cairn_model_writer): create, add/inherit tensors, commit (or abort).
  type, public :: model_writer_type
    private
    type(c_ptr) :: handle = c_null_ptr
  contains
    procedure :: create => writer_create
    generic :: add_tensor => add_tensor_float, add_tensor_double, add_tensor_i32, add_tensor_i64
    procedure :: inherit_tensor => writer_inherit_tensor
    procedure :: inherit_all => writer_inherit_all
    procedure :: set_metadata => writer_set_metadata
    procedure :: set_architecture => writer_set_architecture
    procedure :: commit => writer_commit
    procedure :: abort => writer_abort
    procedure, private :: add_tensor_float => writer_add_tensor_float
    procedure, private :: add_tensor_double => writer_add_tensor_double
    procedure, private :: add_tensor_i32 => writer_add_tensor_i32
    procedure, private :: add_tensor_i64 => writer_add_tensor_i64
  end type model_writer_type

  !> A committed model opened for reading (cairn_model_reader).
  type, public :: model_reader_type
    private
    type(c_ptr) :: handle = c_null_ptr
  contains
    procedure :: open => reader_open
    procedure :: tensor_count => reader_tensor_count
    procedure :: tensor_info => reader_tensor_info
    generic :: read_tensor => read_tensor_float, read_tensor_double, read_tensor_i32, read_tensor_i64
    procedure :: close => reader_close
    procedure, private :: read_tensor_float => reader_read_tensor_float
    procedure, private :: read_tensor_double => reader_read_tensor_double
    procedure, private :: read_tensor_i32 => reader_read_tensor_i32
    procedure, private :: read_tensor_i64 => reader_read_tensor_i64
  end type model_reader_type

  !> cairn_commit_options and cairn_prefetch_options (cairn.h), as the C library sees them; filled by
  !! their _init calls and changed by writer%commit and client%model_prefetch from their arguments.
  type, bind(C) :: cairn_commit_options
    integer(c_size_t) :: size
    integer(c_int) :: durability, wait, pipelined
  end type cairn_commit_options
  type, bind(C) :: cairn_prefetch_options
    integer(c_size_t) :: size
    integer(c_int) :: kind, device, all, timeout_ms
    type(c_ptr) :: progress_id
  end type cairn_prefetch_options

  ! The C API (include/cairn/cairn.h) and cairn_fortran_error.c, as bind(C) interfaces.
  include 'cairn_c_api.inc'

contains

  ! The specific procedures of the generics put_tensor, unpack_tensor, add_tensor and read_tensor: one
  ! per kind, each a call of put_common or read_common below.
  include 'cairn_kinds.inc'

  ! ---- status ----

  !> A static, human-readable string for a status code (e.g. 'not found').
  function cairn_status_string(code) result(s)
    integer(enum_kind), intent(in) :: code
    character(len=:), allocatable :: s
    s = f_string(c_status_string(code))
  end function cairn_status_string

  !> The detail of the last failed cairn call on this thread ('' if none): what was wrong and what to do.
  function cairn_last_error() result(s)
    character(len=:), allocatable :: s
    s = f_string(c_fortran_error())
    if (len(s) == 0) s = f_string(c_last_error())
  end function cairn_last_error

  ! ---- client ----

  function client_initialize(self, address) result(code)
    class(client_type), intent(inout) :: self
    character(len=*), optional, intent(in) :: address
    integer(enum_kind) :: code
    character(kind=c_char), allocatable, target :: c_address(:)
    type(c_ptr) :: p
    call clear_error()
    if (c_associated(self%handle)) then
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, 'client%initialize: this client is already connected to ' // &
           f_string(c_client_address(self%handle)) // '; call client%destructor() first')
      return
    end if
    p = c_null_ptr
    if (present(address)) then
      if (len_trim(address) > 0) then
        call to_c_array(address, c_address)
        p = c_loc(c_address)
      end if
    end if
    code = c_connect(p, self%handle)
    if (code /= CAIRN_OK) self%handle = c_null_ptr
  end function client_initialize

  function client_disconnect(self) result(code)
    class(client_type), intent(inout) :: self
    integer(enum_kind) :: code
    call clear_error()
    if (c_associated(self%handle)) call c_disconnect(self%handle)
    self%handle = c_null_ptr
    code = CAIRN_OK
  end function client_disconnect

  pure logical function client_isinitialized(self)
    class(client_type), intent(in) :: self
    client_isinitialized = c_associated(self%handle)
  end function client_isinitialized

  !> The socket path the client is connected to ('' when it is not).
  function client_address(self) result(s)
    class(client_type), intent(in) :: self
    character(len=:), allocatable :: s
    s = ''
    if (c_associated(self%handle)) s = f_string(c_client_address(self%handle))
  end function client_address

  !> code = client%get_tensor_info(name, dtype, dims): the named tensor's CAIRN_DTYPE_* and its
  !! shape as a Fortran array would have it (the stored shape reversed).
  function client_get_tensor_info(self, name, dtype, dims) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: name
    integer(enum_kind), intent(out) :: dtype
    integer(c_int64_t), allocatable, intent(out) :: dims(:)
    integer(enum_kind) :: code
    integer(c_int) :: ndim
    integer(c_int64_t) :: shape(CAIRN_MAX_DIMS)
    integer(c_size_t) :: nbytes
    dtype = -1
    allocate(dims(0))
    code = need(self%handle, 'client%get_tensor_info', 'client')
    if (code /= CAIRN_OK) return
    code = c_get_tensor_info(self%handle, c_str(name), dtype, ndim, shape, nbytes)
    if (code == CAIRN_OK) dims = shape(ndim:1:-1)
  end function client_get_tensor_info

  function client_poll_tensor_logical(self, name, poll_frequency_ms, num_tries, exists) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: name
    integer, intent(in) :: poll_frequency_ms  !< how long each try waits for the tensor (ms)
    integer, intent(in) :: num_tries          !< how many tries (at least one is made)
    logical, intent(out) :: exists
    integer(enum_kind) :: code
    integer :: i
    integer(c_int) :: found
    exists = .false.
    code = need(self%handle, 'client%poll_tensor', 'client')
    if (code /= CAIRN_OK) return
    do i = 1, max(num_tries, 1)
      code = c_poll_tensor(self%handle, c_str(name), int(max(poll_frequency_ms, 0), c_int), found)
      if (code /= CAIRN_OK) return
      exists = found /= 0
      if (exists) return
    end do
  end function client_poll_tensor_logical

  function client_poll_tensor_c_bool(self, name, poll_frequency_ms, num_tries, exists) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: name
    integer, intent(in) :: poll_frequency_ms, num_tries
    logical(c_bool), intent(out) :: exists
    integer(enum_kind) :: code
    logical :: found
    code = client_poll_tensor_logical(self, name, poll_frequency_ms, num_tries, found)
    exists = logical(found, c_bool)
  end function client_poll_tensor_c_bool

  function client_tensor_exists_logical(self, name, exists) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: name
    logical, intent(out) :: exists
    integer(enum_kind) :: code
    code = client_poll_tensor_logical(self, name, 0, 1, exists)
  end function client_tensor_exists_logical

  function client_tensor_exists_c_bool(self, name, exists) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: name
    logical(c_bool), intent(out) :: exists
    integer(enum_kind) :: code
    code = client_poll_tensor_c_bool(self, name, 0, 1, exists)
  end function client_tensor_exists_c_bool

  function client_delete_tensor(self, name) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: name
    integer(enum_kind) :: code
    code = need(self%handle, 'client%delete_tensor', 'client')
    if (code == CAIRN_OK) code = c_delete_tensor(self%handle, c_str(name))
  end function client_delete_tensor

  !> code = client%prefetch(id): asks the daemon to bring model id into DRAM ahead of need.
  function client_prefetch(self, id) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: id
    integer(enum_kind) :: code
    code = need(self%handle, 'client%prefetch', 'client')
    if (code == CAIRN_OK) code = c_prefetch(self%handle, c_str(id))
  end function client_prefetch

  function client_model_prefetch(self, id, all) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: id
    logical, optional, intent(in) :: all
    integer(enum_kind) :: code
    type(cairn_prefetch_options) :: opts
    code = need(self%handle, 'client%model_prefetch', 'client')
    if (code /= CAIRN_OK) return
    call c_prefetch_options_init(opts)
    if (present(all)) then
      if (all) opts%all = 1
    end if
    code = c_model_prefetch(self%handle, c_str(id), opts, c_null_ptr)
  end function client_model_prefetch

  !> code = client%pipeline_flush(): collects the replies of pipelined (MEMORY + ticket) commits.
  function client_pipeline_flush(self) result(code)
    class(client_type), intent(in) :: self
    integer(enum_kind) :: code
    code = need(self%handle, 'client%pipeline_flush', 'client')
    if (code == CAIRN_OK) code = c_pipeline_flush(self%handle)
  end function client_pipeline_flush

  !> code = client%query(request_json, result_json): a lineage or match query (cairn_query).
  function client_query(self, request_json, result_json) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: request_json
    character(len=:), allocatable, intent(out) :: result_json
    integer(enum_kind) :: code
    type(c_ptr) :: p
    result_json = ''
    code = need(self%handle, 'client%query', 'client')
    if (code /= CAIRN_OK) return
    p = c_null_ptr
    code = c_query(self%handle, c_str(request_json), p)
    if (c_associated(p)) then
      result_json = f_string(p)
      call c_free(p)
    end if
  end function client_query

  !> code = client%request(request_json, response_json): one catalog or administration request of
  !! the wire protocol, e.g. '{"op":"show","id":"m7"}' (cairn_request).
  function client_request(self, request_json, response_json) result(code)
    class(client_type), intent(in) :: self
    character(len=*), intent(in) :: request_json
    character(len=:), allocatable, intent(out) :: response_json
    integer(enum_kind) :: code
    type(c_ptr) :: p
    response_json = ''
    code = need(self%handle, 'client%request', 'client')
    if (code /= CAIRN_OK) return
    p = c_null_ptr
    code = c_request(self%handle, c_str(request_json), p)
    if (c_associated(p)) then
      response_json = f_string(p)
      call c_free(p)
    end if
  end function client_request

  ! ---- model writer ----

  !> code = writer%create(client, id [, parent]): starts model id, derived from parent when given.
  function writer_create(self, client, id, parent) result(code)
    class(model_writer_type), intent(inout) :: self
    type(client_type), intent(in) :: client
    character(len=*), intent(in) :: id
    character(len=*), optional, intent(in) :: parent
    integer(enum_kind) :: code
    character(kind=c_char), allocatable, target :: c_parent(:)
    type(c_ptr) :: p
    code = need(client%handle, 'writer%create', 'client')
    if (code /= CAIRN_OK) return
    if (c_associated(self%handle)) then
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, 'writer%create(' // trim(id) // &
           '): this writer holds a model not yet committed; call writer%commit or writer%abort first')
      return
    end if
    p = c_null_ptr
    if (present(parent)) then
      if (len_trim(parent) > 0) then
        call to_c_array(parent, c_parent)
        p = c_loc(c_parent)
      end if
    end if
    code = c_model_create(client%handle, c_str(id), p, self%handle)
    if (code /= CAIRN_OK) self%handle = c_null_ptr
  end function writer_create

  !> code = writer%inherit_tensor(name): keeps the parent's tensor unchanged (no bytes, no hashing).
  function writer_inherit_tensor(self, name) result(code)
    class(model_writer_type), intent(in) :: self
    character(len=*), intent(in) :: name
    integer(enum_kind) :: code
    code = need(self%handle, 'writer%inherit_tensor', 'writer')
    if (code == CAIRN_OK) code = c_model_inherit_tensor(self%handle, c_str(name))
  end function writer_inherit_tensor

  !> code = writer%inherit_all(): keeps every parent tensor not added or inherited by name.
  function writer_inherit_all(self) result(code)
    class(model_writer_type), intent(in) :: self
    integer(enum_kind) :: code
    code = need(self%handle, 'writer%inherit_all', 'writer')
    if (code == CAIRN_OK) code = c_model_inherit_all(self%handle)
  end function writer_inherit_all

  !> code = writer%set_metadata(json): a JSON object (score, epoch, task, tags ...).
  function writer_set_metadata(self, json) result(code)
    class(model_writer_type), intent(in) :: self
    character(len=*), intent(in) :: json
    integer(enum_kind) :: code
    code = need(self%handle, 'writer%set_metadata', 'writer')
    if (code == CAIRN_OK) code = c_model_set_metadata(self%handle, c_str(json))
  end function writer_set_metadata

  !> code = writer%set_architecture(json): the architecture graph (docs/graph-format.md).
  function writer_set_architecture(self, json) result(code)
    class(model_writer_type), intent(in) :: self
    character(len=*), intent(in) :: json
    integer(enum_kind) :: code
    code = need(self%handle, 'writer%set_architecture', 'writer')
    if (code == CAIRN_OK) code = c_model_set_architecture(self%handle, c_str(json))
  end function writer_set_architecture

  !> code = writer%commit(durability [, ticket] [, pipelined]): commits and ends the writer, whatever
  !! the result (cairn_model_commit_opts). Without a ticket the call returns once `durability` is
  !! reached, with the commit's error. With one it does not wait: pipelined (default: durability is
  !! CAIRN_DURABILITY_MEMORY) returns as soon as the request is written and ticket%wait returns the
  !! commit's outcome, then the durability; otherwise it returns once the model is visible and the
  !! ticket waits for the durability. pipelined without a ticket is CAIRN_ERR_INVALID_ARGUMENT.
  function writer_commit(self, durability, ticket, pipelined) result(code)
    class(model_writer_type), intent(inout) :: self
    integer(enum_kind), intent(in) :: durability
    type(ticket_type), optional, intent(inout) :: ticket
    logical, optional, intent(in) :: pipelined
    integer(enum_kind) :: code
    type(c_ptr), target :: t
    type(cairn_commit_options) :: opts
    code = need(self%handle, 'writer%commit', 'writer')
    if (code /= CAIRN_OK) return
    call c_commit_options_init(opts)
    opts%durability = durability
    if (present(ticket)) then
      if (c_associated(ticket%handle)) then
        code = fail(CAIRN_ERR_INVALID_ARGUMENT, 'writer%commit: the ticket still holds an earlier commit''s '// &
             'ticket; call ticket%free() first (the writer is still open)')
        return
      end if
      opts%wait = 0
      opts%pipelined = merge(1, 0, durability == CAIRN_DURABILITY_MEMORY)
      if (present(pipelined)) opts%pipelined = merge(1, 0, pipelined)
      t = c_null_ptr
      code = c_model_commit_opts(self%handle, opts, c_loc(t))
      ticket%handle = t
    else
      if (present(pipelined)) opts%wait = merge(0, 1, pipelined)
      if (present(pipelined)) opts%pipelined = merge(1, 0, pipelined)
      code = c_model_commit_opts(self%handle, opts, c_null_ptr)
    end if
    self%handle = c_null_ptr
  end function writer_commit

  !> call writer%abort(): drops a model not committed (nothing if the writer holds none).
  subroutine writer_abort(self)
    class(model_writer_type), intent(inout) :: self
    if (c_associated(self%handle)) call c_model_abort(self%handle)
    self%handle = c_null_ptr
  end subroutine writer_abort

  ! ---- ticket ----

  !> code = ticket%wait(timeout_ms): waits up to timeout_ms (-1: forever); CAIRN_ERR_TIMEOUT: not yet.
  function ticket_wait(self, timeout_ms) result(code)
    class(ticket_type), intent(in) :: self
    integer, intent(in) :: timeout_ms
    integer(enum_kind) :: code
    code = need(self%handle, 'ticket%wait', 'ticket')
    if (code == CAIRN_OK) code = c_wait(self%handle, int(timeout_ms, c_int))
  end function ticket_wait

  subroutine ticket_free(self)
    class(ticket_type), intent(inout) :: self
    if (c_associated(self%handle)) call c_ticket_free(self%handle)
    self%handle = c_null_ptr
  end subroutine ticket_free

  ! ---- model reader ----

  !> code = reader%open(client, id): opens committed model id for reading.
  function reader_open(self, client, id) result(code)
    class(model_reader_type), intent(inout) :: self
    type(client_type), intent(in) :: client
    character(len=*), intent(in) :: id
    integer(enum_kind) :: code
    code = need(client%handle, 'reader%open', 'client')
    if (code /= CAIRN_OK) return
    if (c_associated(self%handle)) then
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, 'reader%open(' // trim(id) // &
           '): this reader holds an open model; call reader%close() first')
      return
    end if
    code = c_model_open(client%handle, c_str(id), self%handle)
    if (code /= CAIRN_OK) self%handle = c_null_ptr
  end function reader_open

  function reader_tensor_count(self, count) result(code)
    class(model_reader_type), intent(in) :: self
    integer, intent(out) :: count
    integer(enum_kind) :: code
    integer(c_size_t) :: n
    count = 0
    code = need(self%handle, 'reader%tensor_count', 'reader')
    if (code /= CAIRN_OK) return
    code = c_model_tensor_count(self%handle, n)
    if (code == CAIRN_OK) count = int(n)
  end function reader_tensor_count

  !> code = reader%tensor_info(index, name, dtype, dims): tensor number index (1..count): its name,
  !! CAIRN_DTYPE_* and shape as a Fortran array would have it (the stored shape reversed).
  function reader_tensor_info(self, index, name, dtype, dims) result(code)
    class(model_reader_type), intent(in) :: self
    integer, intent(in) :: index
    character(len=:), allocatable, intent(out) :: name
    integer(enum_kind), intent(out) :: dtype
    integer(c_int64_t), allocatable, intent(out) :: dims(:)
    integer(enum_kind) :: code
    type(c_ptr) :: p
    integer(c_int) :: ndim
    integer(c_int64_t) :: shape(CAIRN_MAX_DIMS)
    integer(c_size_t) :: nbytes
    name = ''
    dtype = -1
    allocate(dims(0))
    code = need(self%handle, 'reader%tensor_info', 'reader')
    if (code /= CAIRN_OK) return
    if (index < 1) then
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, 'reader%tensor_info: index ' // itoa(int(index, c_int64_t)) // &
           ' is out of range; tensors are numbered from 1 to reader%tensor_count()')
      return
    end if
    code = c_model_tensor_info(self%handle, int(index - 1, c_size_t), p, dtype, ndim, shape, nbytes)
    if (code /= CAIRN_OK) return
    name = f_string(p)
    dims = shape(ndim:1:-1)
  end function reader_tensor_info

  !> call reader%close(): ends the reader and its leases (nothing if none is open).
  subroutine reader_close(self)
    class(model_reader_type), intent(inout) :: self
    if (c_associated(self%handle)) call c_model_close(self%handle)
    self%handle = c_null_ptr
  end subroutine reader_close

  ! ---- shared by the kinds ----

  !> Stores a Fortran array (put_tensor when to_model is false, add_tensor when true): the row-major
  !! shape is the Fortran shape reversed, the bytes are the array's own.
  function put_common(handle, to_model, name, data, fshape, dtype, dims) result(code)
    type(c_ptr), intent(in) :: handle
    logical, intent(in) :: to_model
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: data
    integer(c_int64_t), intent(in) :: fshape(:)
    integer(enum_kind), intent(in) :: dtype
    integer, dimension(:), optional, intent(in) :: dims
    integer(enum_kind) :: code
    integer(c_int64_t) :: cshape(CAIRN_MAX_DIMS)
    integer(c_int) :: ndim
    character(len=:), allocatable :: what
    if (to_model) then
      what = 'writer%add_tensor(' // trim(name) // ')'
      code = need(handle, what, 'writer')
    else
      what = 'client%put_tensor(' // trim(name) // ')'
      code = need(handle, what, 'client')
    end if
    if (code /= CAIRN_OK) return
    code = check_dims(what, fshape, dims)
    if (code /= CAIRN_OK) return
    ndim = int(size(fshape), c_int)
    cshape = 0
    cshape(1:ndim) = fshape(ndim:1:-1)
    if (to_model) then
      code = c_model_add_tensor(handle, c_str(name), data, dtype, ndim, cshape)
    else
      code = c_put_tensor(handle, c_str(name), data, dtype, ndim, cshape)
    end if
  end function put_common

  !> Copies a tensor into a Fortran array (unpack_tensor when from_model is false, read_tensor when
  !! true) after checking that the array has the tensor's dtype and its shape reversed.
  function read_common(handle, from_model, name, dst, fshape, dtype, kind_name, dims) result(code)
    type(c_ptr), intent(in) :: handle
    logical, intent(in) :: from_model
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: dst
    integer(c_int64_t), intent(in) :: fshape(:)
    integer(enum_kind), intent(in) :: dtype
    character(len=*), intent(in) :: kind_name
    integer, dimension(:), optional, intent(in) :: dims
    integer(enum_kind) :: code
    integer(c_int64_t) :: cshape(CAIRN_MAX_DIMS)
    integer(c_int) :: ndim, got_dtype
    integer(c_size_t) :: nbytes
    character(len=:), allocatable :: what
    if (from_model) then
      what = 'reader%read_tensor(' // trim(name) // ')'
      code = need(handle, what, 'reader')
    else
      what = 'client%unpack_tensor(' // trim(name) // ')'
      code = need(handle, what, 'client')
    end if
    if (code /= CAIRN_OK) return
    code = check_dims(what, fshape, dims)
    if (code /= CAIRN_OK) return
    if (from_model) then
      code = find_model_tensor(handle, name, got_dtype, ndim, cshape, nbytes)
    else
      code = c_get_tensor_info(handle, c_str(name), got_dtype, ndim, cshape, nbytes)
    end if
    if (code /= CAIRN_OK) return
    if (got_dtype /= dtype) then
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': the tensor is ' // dtype_name(got_dtype) // &
           ', the array is ' // kind_name // '; ' // fortran_kind_hint(got_dtype))
      return
    end if
    if (ndim /= size(fshape)) then
      code = mismatch()
      return
    end if
    if (any(cshape(ndim:1:-1) /= fshape)) then
      code = mismatch()
      return
    end if
    if (from_model) then
      code = c_model_read_tensor(handle, c_str(name), dst, nbytes, kMemHost)
    else
      code = c_unpack_tensor(handle, c_str(name), dst, nbytes)
    end if
  contains
    integer(enum_kind) function mismatch()
      mismatch = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': the tensor has the row-major shape ' // &
           shape_text(cshape(1:ndim), '[', ']') // ', read in Fortran as an array of shape ' // &
           shape_text(cshape(ndim:1:-1), '(', ')') // ', but the array has shape ' // &
           shape_text(fshape, '(', ')') // ' (docs/fortran.md, "Array layout")')
    end function mismatch
  end function read_common

  !> The description of model tensor `name` in reader r (C numbers them; the API reads by name).
  function find_model_tensor(r, name, dtype, ndim, shape, nbytes) result(code)
    type(c_ptr), intent(in) :: r
    character(len=*), intent(in) :: name
    integer(c_int), intent(out) :: dtype, ndim
    integer(c_int64_t), intent(out) :: shape(CAIRN_MAX_DIMS)
    integer(c_size_t), intent(out) :: nbytes
    integer(enum_kind) :: code
    integer(c_size_t) :: count, i
    type(c_ptr) :: p
    dtype = -1
    ndim = 0
    shape = 0
    nbytes = 0
    code = c_model_tensor_count(r, count)
    if (code /= CAIRN_OK) return
    do i = 0, count - 1
      code = c_model_tensor_info(r, i, p, dtype, ndim, shape, nbytes)
      if (code /= CAIRN_OK) return
      if (f_string(p) == trim(name)) return
    end do
    code = fail(CAIRN_ERR_NOT_FOUND, 'reader%read_tensor(' // trim(name) // '): the model has no tensor of that '// &
         'name (it has ' // itoa(int(count, c_int64_t)) // '; reader%tensor_info lists them)')
  end function find_model_tensor

  !> CAIRN_OK, or CAIRN_ERR_INVALID_ARGUMENT when the rank is over CAIRN_MAX_DIMS or a SmartRedis-style
  !! `dims` (given) is not the array's shape.
  function check_dims(what, fshape, dims) result(code)
    character(len=*), intent(in) :: what
    integer(c_int64_t), intent(in) :: fshape(:)
    integer, dimension(:), optional, intent(in) :: dims
    integer(enum_kind) :: code
    code = CAIRN_OK
    if (size(fshape) > CAIRN_MAX_DIMS) then
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': the array has rank ' // itoa(int(size(fshape), c_int64_t)) &
           // '; at most ' // itoa(int(CAIRN_MAX_DIMS, c_int64_t)) // ' dimensions are supported')
      return
    end if
    if (.not. present(dims)) return
    if (size(dims) == size(fshape)) then
      if (all(int(dims, c_int64_t) == fshape)) return
    end if
    code = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': dims ' // shape_text(int(dims, c_int64_t), '(', ')') // &
         ' is not the shape of the array, ' // shape_text(fshape, '(', ')') // &
         '; pass shape(array) or leave dims out')
  end function check_dims

  !> CAIRN_OK when handle is set, else CAIRN_ERR_INVALID_ARGUMENT naming what to call first. Clears
  !! the module's error detail (every wrapper calls it first).
  function need(handle, what, object) result(code)
    type(c_ptr), intent(in) :: handle
    character(len=*), intent(in) :: what, object
    integer(enum_kind) :: code
    call clear_error()
    code = CAIRN_OK
    if (c_associated(handle)) return
    select case (object)
    case ('client')
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': the client is not connected; call client%initialize() first')
    case ('writer')
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': the writer holds no model; call writer%create() first '// &
           '(commit and abort end it)')
    case ('reader')
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': the reader holds no model; call reader%open() first')
    case default
      code = fail(CAIRN_ERR_INVALID_ARGUMENT, what // ': the ticket is empty; pass it to writer%commit() first')
    end select
  end function need

  !> Records message as this thread's error detail and returns code.
  function fail(code, message) result(r)
    integer(enum_kind), intent(in) :: code
    character(len=*), intent(in) :: message
    integer(enum_kind) :: r
    call c_fortran_set_error(c_str(message))
    r = code
  end function fail

  subroutine clear_error()
    call c_fortran_set_error(c_null_char)
  end subroutine clear_error

  function dtype_name(dtype) result(s)
    integer(c_int), intent(in) :: dtype
    character(len=:), allocatable :: s
    if (dtype >= lbound(kDtypeNames, 1) .and. dtype <= ubound(kDtypeNames, 1)) then
      s = trim(kDtypeNames(dtype))
    else
      s = 'dtype ' // itoa(int(dtype, c_int64_t))
    end if
  end function dtype_name

  !> What to read a tensor of dtype into.
  function fortran_kind_hint(dtype) result(s)
    integer(c_int), intent(in) :: dtype
    character(len=:), allocatable :: s
    select case (dtype)
    case (CAIRN_DTYPE_F32)
      s = 'read it into a real(real32) array'
    case (CAIRN_DTYPE_F64)
      s = 'read it into a real(real64) array'
    case (CAIRN_DTYPE_I32)
      s = 'read it into an integer(int32) array'
    case (CAIRN_DTYPE_I64)
      s = 'read it into an integer(int64) array'
    case default
      s = 'the Fortran module reads F32, F64, I32 and I64 only; convert it from C or Python (docs/fortran.md)'
    end select
  end function fortran_kind_hint

  !> '(3,4)' or '[4,3]'.
  function shape_text(s, open, close) result(t)
    integer(c_int64_t), intent(in) :: s(:)
    character(len=1), intent(in) :: open, close
    character(len=:), allocatable :: t
    integer :: i
    t = open
    do i = 1, size(s)
      if (i > 1) t = t // ','
      t = t // itoa(s(i))
    end do
    t = t // close
  end function shape_text

  function itoa(i) result(s)
    integer(c_int64_t), intent(in) :: i
    character(len=:), allocatable :: s
    character(len=24) :: buf
    write (buf, '(i0)') i
    s = trim(buf)
  end function itoa

  !> s without trailing blanks, NUL-terminated, for a C string argument.
  pure function c_str(s) result(r)
    character(len=*), intent(in) :: s
    character(kind=c_char, len=len_trim(s) + 1) :: r
    r = trim(s) // c_null_char
  end function c_str

  !> s without trailing blanks, NUL-terminated, as a character array whose c_loc can be passed.
  subroutine to_c_array(s, a)
    character(len=*), intent(in) :: s
    character(kind=c_char), allocatable, intent(out) :: a(:)
    integer :: i, n
    n = len_trim(s)
    allocate(a(n + 1))
    do i = 1, n
      a(i) = s(i:i)
    end do
    a(n + 1) = c_null_char
  end subroutine to_c_array

  !> A copy of the NUL-terminated C string p ('' for NULL).
  function f_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function f_string

end module cairn
