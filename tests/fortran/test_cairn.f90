!> The Fortran module `cairn` against a running cairnd ($CAIRN_SOCKET). Run by
!! tests/integration/test_fortran.py, which starts and stops the daemon, puts the tensor
!! 'python/layout' before and reads 'fortran/layout' and the models after. Prints one PASS or FAIL
!! line per check (SKIP when run without the Python side) and exits non-zero if any check failed.
!! Optional argument: a suffix for the model ids, so the program can run twice on one repository.
program test_cairn
  use, intrinsic :: iso_c_binding, only: c_ptr, c_loc, c_f_pointer, c_float, c_double, c_int8_t, &
       c_int32_t, c_int64_t, c_bool
  use cairn
  implicit none

  integer :: passed = 0, failed = 0
  type(client_type) :: client
  character(len=64) :: suffix

  suffix = ''
  if (command_argument_count() > 0) call get_command_argument(1, suffix)

  call test_status_and_connect()
  if (client%isinitialized()) then
    call test_real32()
    call test_real64()
    call test_int32()
    call test_int64()
    call test_named_tensor_errors()
    call test_rule_names()
    call test_layout()
    call test_models()
    call check_code(client%destructor(), CAIRN_OK, 'disconnect')
    call check(.not. client%isinitialized(), 'not connected after disconnect')
    call check(client%address() == '', 'no address after disconnect')
  end if

  write (*, '(i0, " passed, ", i0, " failed")') passed, failed
  if (failed > 0) stop 1

contains

  ! ---- reporting ----

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (ok) then
      passed = passed + 1
      write (*, '(a)') 'PASS ' // what
    else
      failed = failed + 1
      write (*, '(a)') 'FAIL ' // what // ' (last error: ' // cairn_last_error() // ')'
    end if
  end subroutine check

  !> Checks that code is expected; for an error, also that cairn_last_error() says something.
  subroutine check_code(code, expected, what)
    integer(enum_kind), intent(in) :: code, expected
    character(len=*), intent(in) :: what
    character(len=:), allocatable :: err
    if (code == expected .and. expected /= CAIRN_OK) then
      err = cairn_last_error()
      if (len(err) == 0) then
        failed = failed + 1
        write (*, '(a)') 'FAIL ' // what // ': ' // cairn_status_string(code) // ' but cairn_last_error() is empty'
        return
      end if
      passed = passed + 1
      write (*, '(a)') 'PASS ' // what // ' (' // cairn_status_string(code) // ': ' // err // ')'
      return
    end if
    if (code == expected) then
      passed = passed + 1
      write (*, '(a)') 'PASS ' // what
      return
    end if
    failed = failed + 1
    write (*, '(a, i0, a, i0, a)') 'FAIL ' // what // ': status ', code, ' (' // cairn_status_string(code) // &
         '), expected ', expected, ' (' // cairn_status_string(expected) // '); last error: ' // cairn_last_error()
  end subroutine check_code

  !> Whether the nbytes bytes at a and b are equal (an exact comparison, reals included).
  logical function same_bytes(a, b, nbytes)
    type(c_ptr), intent(in) :: a, b
    integer, intent(in) :: nbytes
    integer(c_int8_t), pointer :: pa(:), pb(:)
    call c_f_pointer(a, pa, [nbytes])
    call c_f_pointer(b, pb, [nbytes])
    same_bytes = all(pa == pb)
  end function same_bytes

  function itoa(i) result(s)
    integer, intent(in) :: i
    character(len=:), allocatable :: s
    character(len=16) :: buf
    write (buf, '(i0)') i
    s = trim(buf)
  end function itoa

  !> 'f/real32_rank_1' for 'real32 rank 1'.
  function key_of(label) result(key)
    character(len=*), intent(in) :: label
    character(len=:), allocatable :: key
    integer :: i
    key = 'f/' // label
    do i = 1, len(key)
      if (key(i:i) == ' ') key(i:i) = '_'
    end do
  end function key_of

  function dims_text(d) result(s)
    integer, intent(in) :: d(:)
    character(len=:), allocatable :: s
    integer :: i
    s = '('
    do i = 1, size(d)
      if (i > 1) s = s // ','
      s = s // itoa(d(i))
    end do
    s = s // ')'
  end function dims_text

  ! ---- status codes, connecting ----

  subroutine test_status_and_connect()
    type(client_type) :: nowhere
    character(len=4096) :: socket
    integer :: socket_len, env_status
    real(c_float) :: x(2)
    logical :: ok
    call check(cairn_status_string(CAIRN_OK) == 'ok', 'status string CAIRN_OK')
    call check(cairn_status_string(CAIRN_ERR_NOT_FOUND) == 'not found', 'status string CAIRN_ERR_NOT_FOUND')
    ok = cairn_status_string(CAIRN_ERR_PROTOCOL) == 'protocol error'
    call check(ok .and. CAIRN_ERR_PROTOCOL == 12, 'status constants generated from status_codes.h')
    call check_code(nowhere%initialize('/nonexistent/dir/cairnd.sock'), CAIRN_ERR_UNAVAILABLE, &
         'connect to a missing socket')
    call check(index(cairn_last_error(), '/nonexistent/dir/cairnd.sock') > 0 .and. .not. nowhere%isinitialized(), &
         'the error names the socket')
    x = 1
    call check_code(nowhere%put_tensor('f/x', x), CAIRN_ERR_INVALID_ARGUMENT, 'put_tensor before initialize')
    call check(index(cairn_last_error(), 'initialize') > 0, 'the error says to call initialize')
    call check_code(client%initialize(), CAIRN_OK, 'connect ($CAIRN_SOCKET)')
    if (.not. client%isinitialized()) return
    call get_environment_variable('CAIRN_SOCKET', socket, socket_len, env_status)
    if (env_status == 0) call check(client%address() == socket(1:socket_len), 'address is $CAIRN_SOCKET')
    call check_code(client%connect(), CAIRN_ERR_INVALID_ARGUMENT, 'connect twice')
  end subroutine test_status_and_connect

  ! ---- named tensors: every kind and rank 1..4 ----

  !> After a round trip of key: its info, poll found, delete, gone (poll, exists, unpack, delete).
  subroutine after_roundtrip(label, key, fshape, dtype)
    character(len=*), intent(in) :: label, key
    integer, intent(in) :: fshape(:)
    integer(enum_kind), intent(in) :: dtype
    integer(enum_kind) :: code, got_dtype
    integer(c_int64_t), allocatable :: dims(:)
    logical :: found
    logical(c_bool) :: found_c
    real(c_double) :: scratch(1)
    code = client%get_tensor_info(key, got_dtype, dims)
    call check(code == CAIRN_OK .and. got_dtype == dtype .and. size(dims) == size(fshape), 'info ' // label)
    if (size(dims) == size(fshape)) call check(all(dims == fshape), 'info dims ' // label // ' ' // dims_text(fshape))
    code = client%poll_tensor(key, 10, 1, found)
    call check(code == CAIRN_OK .and. found, 'poll found ' // label)
    code = client%tensor_exists(key, found_c)
    call check(code == CAIRN_OK .and. logical(found_c), 'tensor_exists ' // label)
    call check_code(client%delete_tensor(key), CAIRN_OK, 'delete ' // label)
    code = client%poll_tensor(key, 20, 2, found)
    call check(code == CAIRN_OK .and. .not. found, 'poll not found after delete ' // label)
    code = client%tensor_exists(key, found)
    call check(code == CAIRN_OK .and. .not. found, 'tensor_exists false after delete ' // label)
    call check_code(client%unpack_tensor(key, scratch), CAIRN_ERR_NOT_FOUND, 'unpack deleted ' // label)
    call check_code(client%delete_tensor(key), CAIRN_ERR_NOT_FOUND, 'delete deleted ' // label)
  end subroutine after_roundtrip

  subroutine roundtrip_float(label, a, b)
    character(len=*), intent(in) :: label
    real(c_float), dimension(..), contiguous, target, intent(in) :: a
    real(c_float), dimension(..), contiguous, target, intent(inout) :: b
    character(len=:), allocatable :: key
    key = key_of(label)
    call check_code(client%put_tensor(key, a, shape(a)), CAIRN_OK, 'put_tensor ' // label)
    call check_code(client%unpack_tensor(key, b, shape(b)), CAIRN_OK, 'unpack_tensor ' // label)
    call check(same_bytes(c_loc(a), c_loc(b), int(size(a) * storage_size(a) / 8)), &
         'put/unpack ' // label // ' ' // dims_text(shape(a)))
    call after_roundtrip(label, key, shape(a), CAIRN_DTYPE_F32)
  end subroutine roundtrip_float

  subroutine roundtrip_double(label, a, b)
    character(len=*), intent(in) :: label
    real(c_double), dimension(..), contiguous, target, intent(in) :: a
    real(c_double), dimension(..), contiguous, target, intent(inout) :: b
    character(len=:), allocatable :: key
    key = key_of(label)
    call check_code(client%put_tensor(key, a), CAIRN_OK, 'put_tensor ' // label)
    call check_code(client%unpack_tensor(key, b), CAIRN_OK, 'unpack_tensor ' // label)
    call check(same_bytes(c_loc(a), c_loc(b), int(size(a) * storage_size(a) / 8)), &
         'put/unpack ' // label // ' ' // dims_text(shape(a)))
    call after_roundtrip(label, key, shape(a), CAIRN_DTYPE_F64)
  end subroutine roundtrip_double

  subroutine roundtrip_i32(label, a, b)
    character(len=*), intent(in) :: label
    integer(c_int32_t), dimension(..), contiguous, target, intent(in) :: a
    integer(c_int32_t), dimension(..), contiguous, target, intent(inout) :: b
    character(len=:), allocatable :: key
    key = key_of(label)
    call check_code(client%put_tensor(key, a), CAIRN_OK, 'put_tensor ' // label)
    call check_code(client%unpack_tensor(key, b), CAIRN_OK, 'unpack_tensor ' // label)
    call check(same_bytes(c_loc(a), c_loc(b), int(size(a) * storage_size(a) / 8)), &
         'put/unpack ' // label // ' ' // dims_text(shape(a)))
    call after_roundtrip(label, key, shape(a), CAIRN_DTYPE_I32)
  end subroutine roundtrip_i32

  subroutine roundtrip_i64(label, a, b)
    character(len=*), intent(in) :: label
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: a
    integer(c_int64_t), dimension(..), contiguous, target, intent(inout) :: b
    character(len=:), allocatable :: key
    key = key_of(label)
    call check_code(client%put_tensor(key, a), CAIRN_OK, 'put_tensor ' // label)
    call check_code(client%unpack_tensor(key, b), CAIRN_OK, 'unpack_tensor ' // label)
    call check(same_bytes(c_loc(a), c_loc(b), int(size(a) * storage_size(a) / 8)), &
         'put/unpack ' // label // ' ' // dims_text(shape(a)))
    call after_roundtrip(label, key, shape(a), CAIRN_DTYPE_I64)
  end subroutine roundtrip_i64

  ! Values with full bit patterns (reals that are not short binary fractions, integers past 2**32),
  ! different in every element, on non-square shapes so that a transposition would show.

  !> The names of the C API's rule reach the same procedures as the SmartRedis names.
  subroutine test_rule_names()
    real(c_float) :: a(3, 2), b(3, 2)
    integer(enum_kind) :: dtype
    integer(c_int64_t), allocatable :: dims(:)
    logical :: exists
    a = reshape([1.5_c_float, 2.5_c_float, 3.5_c_float, 4.5_c_float, 5.5_c_float, 6.5_c_float], [3, 2])
    b = 0
    call check_code(client%tensor_put('fortran/rule', a), CAIRN_OK, 'tensor_put')
    call check_code(client%tensor_info('fortran/rule', dtype, dims), CAIRN_OK, 'tensor_info')
    call check(dtype == CAIRN_DTYPE_F32 .and. size(dims) == 2, 'tensor_info: dtype and rank')
    call check_code(client%tensor_unpack('fortran/rule', b), CAIRN_OK, 'tensor_unpack')
    call check(all(a == b), 'tensor_put/tensor_unpack round trip')
    call check_code(client%tensor_poll('fortran/rule', 10, 1, exists), CAIRN_OK, 'tensor_poll')
    call check(exists, 'tensor_poll finds the tensor')
    call check_code(client%tensor_delete('fortran/rule'), CAIRN_OK, 'tensor_delete')
    call check_code(client%tensor_delete('fortran/rule'), CAIRN_ERR_NOT_FOUND, 'tensor_delete twice')
  end subroutine test_rule_names

  subroutine test_real32()
    real(c_float) :: a1(7), a2(3, 5), a3(2, 3, 4), a4(2, 3, 2, 3)
    real(c_float) :: b1(7), b2(3, 5), b3(2, 3, 4), b4(2, 3, 2, 3)
    integer :: i
    a1 = [(real(i, c_float) * 0.1_c_float - 3.3_c_float, i = 1, 7)]
    a2 = reshape([(real(i, c_float) / 7.0_c_float - 1.0_c_float, i = 1, 15)], [3, 5])
    a3 = reshape([(real(i, c_float) * 1.1e-3_c_float, i = 1, 24)], [2, 3, 4])
    a4 = reshape([(-real(i, c_float) * 3.7e5_c_float, i = 1, 36)], [2, 3, 2, 3])
    b1 = 0; b2 = 0; b3 = 0; b4 = 0
    call roundtrip_float('real32 rank 1', a1, b1)
    call roundtrip_float('real32 rank 2', a2, b2)
    call roundtrip_float('real32 rank 3', a3, b3)
    call roundtrip_float('real32 rank 4', a4, b4)
  end subroutine test_real32

  subroutine test_real64()
    real(c_double) :: a1(5), a2(4, 3), a3(5, 2, 3), a4(2, 3, 4, 5)
    real(c_double) :: b1(5), b2(4, 3), b3(5, 2, 3), b4(2, 3, 4, 5)
    integer :: i
    a1 = [(real(i, c_double) / 3.0_c_double - 1.0e3_c_double, i = 1, 5)]
    a2 = reshape([(sqrt(real(i, c_double)), i = 1, 12)], [4, 3])
    a3 = reshape([(real(i, c_double) * 1.0e-300_c_double, i = 1, 30)], [5, 2, 3])
    a4 = reshape([(-real(i, c_double) * 0.1_c_double, i = 1, 120)], [2, 3, 4, 5])
    b1 = 0; b2 = 0; b3 = 0; b4 = 0
    call roundtrip_double('real64 rank 1', a1, b1)
    call roundtrip_double('real64 rank 2', a2, b2)
    call roundtrip_double('real64 rank 3', a3, b3)
    call roundtrip_double('real64 rank 4', a4, b4)
  end subroutine test_real64

  subroutine test_int32()
    integer(c_int32_t) :: a1(9), a2(2, 3), a3(3, 4, 5), a4(1, 4, 2, 2)
    integer(c_int32_t) :: b1(9), b2(2, 3), b3(3, 4, 5), b4(1, 4, 2, 2)
    integer(c_int32_t) :: i
    a1 = [(i * 7919_c_int32_t - 50000_c_int32_t, i = 1, 9)]
    a2 = reshape([(i * 104729_c_int32_t - 1073741823_c_int32_t, i = 1, 6)], [2, 3])
    a3 = reshape([(-i * i, i = 1, 60)], [3, 4, 5])
    a4 = reshape([(i, i = 1, 16)], [1, 4, 2, 2])
    b1 = 0; b2 = 0; b3 = 0; b4 = 0
    call roundtrip_i32('int32 rank 1', a1, b1)
    call roundtrip_i32('int32 rank 2', a2, b2)
    call roundtrip_i32('int32 rank 3', a3, b3)
    call roundtrip_i32('int32 rank 4', a4, b4)
  end subroutine test_int32

  subroutine test_int64()
    integer(c_int64_t) :: a1(4), a2(5, 2), a3(2, 2, 2), a4(4, 3, 2, 2)
    integer(c_int64_t) :: b1(4), b2(5, 2), b3(2, 2, 2), b4(4, 3, 2, 2)
    integer(c_int64_t) :: i
    a1 = [(i * 3000000019_c_int64_t - 2_c_int64_t**40, i = 1, 4)]
    a2 = reshape([(huge(i) - i, i = 1, 10)], [5, 2])
    a3 = reshape([(-i * 2_c_int64_t**33, i = 1, 8)], [2, 2, 2])
    a4 = reshape([(i * 1000000007_c_int64_t, i = 1, 48)], [4, 3, 2, 2])
    b1 = 0; b2 = 0; b3 = 0; b4 = 0
    call roundtrip_i64('int64 rank 1', a1, b1)
    call roundtrip_i64('int64 rank 2', a2, b2)
    call roundtrip_i64('int64 rank 3', a3, b3)
    call roundtrip_i64('int64 rank 4', a4, b4)
  end subroutine test_int64

  ! ---- named tensors: errors, arguments, sections, scalars ----

  subroutine test_named_tensor_errors()
    real(c_float) :: w(3, 5), wrong(5, 3), sec_src(7), sec_dst(8)
    real(c_double) :: d(3, 5), scalar, scalar_back
    integer(c_int64_t), allocatable :: dims(:)
    integer(enum_kind) :: dtype
    logical :: found
    logical(c_bool) :: found_c
    integer :: i
    w = reshape([(real(i, c_float), i = 1, 15)], [3, 5])
    call check_code(client%unpack_tensor('f/never-stored', w), CAIRN_ERR_NOT_FOUND, 'unpack unknown key')
    call check_code(client%delete_tensor('f/never-stored'), CAIRN_ERR_NOT_FOUND, 'delete unknown key')
    call check_code(client%get_tensor_info('f/never-stored', dtype, dims), CAIRN_ERR_NOT_FOUND, 'info unknown key')
    call check_code(client%poll_tensor('f/never-stored', 20, 3, found_c), CAIRN_OK, 'poll unknown key (c_bool)')
    call check(.not. logical(found_c), 'poll unknown key is not found')

    ! SmartRedis-style dims: must be the array's shape.
    call check_code(client%put_tensor('f/w', w, [5, 3]), CAIRN_ERR_INVALID_ARGUMENT, 'put_tensor with wrong dims')
    call check(index(cairn_last_error(), 'dims') > 0, 'the error names dims')
    call check_code(client%put_tensor('f/w', w, [3, 5]), CAIRN_OK, 'put_tensor with dims')
    ! The kind and the shape of the result must be the tensor's.
    call check_code(client%unpack_tensor('f/w', d), CAIRN_ERR_INVALID_ARGUMENT, 'unpack F32 into real64')
    call check(index(cairn_last_error(), 'F32') > 0, 'the error names the dtype')
    call check_code(client%unpack_tensor('f/w', wrong), CAIRN_ERR_INVALID_ARGUMENT, 'unpack (3,5) into (5,3)')
    call check(index(cairn_last_error(), '(3,5)') > 0, 'the error names the shape')
    call check_code(client%unpack_tensor('f/w', w, [3, 5]), CAIRN_OK, 'unpack with dims')
    call check_code(client%delete_tensor('f/w'), CAIRN_OK, 'delete f/w')

    ! Non-contiguous sections are copied in and out.
    sec_src = [(real(i, c_float) + 0.25_c_float, i = 1, 7)]
    sec_dst = 0
    call check_code(client%put_tensor('f/section', sec_src(1:7:2)), CAIRN_OK, 'put a strided section')
    call check_code(client%unpack_tensor('f/section', sec_dst(2:8:2)), CAIRN_OK, 'unpack into a strided section')
    call check(all(sec_dst(2:8:2) == sec_src(1:7:2)) .and. all(sec_dst(1:7:2) == 0), 'strided section round trip')
    call check_code(client%delete_tensor('f/section'), CAIRN_OK, 'delete f/section')

    ! Rank 0.
    scalar = 4.0_c_double * atan(1.0_c_double)
    scalar_back = 0
    call check_code(client%put_tensor('f/scalar', scalar), CAIRN_OK, 'put a scalar')
    call check_code(client%get_tensor_info('f/scalar', dtype, dims), CAIRN_OK, 'info of a scalar')
    call check(dtype == CAIRN_DTYPE_F64 .and. size(dims) == 0, 'a scalar is an F64 of rank 0')
    call check_code(client%unpack_tensor('f/scalar', scalar_back), CAIRN_OK, 'unpack a scalar')
    call check(scalar_back == scalar, 'scalar round trip')
    call check_code(client%delete_tensor('f/scalar'), CAIRN_OK, 'delete f/scalar')
    call check_code(client%poll_tensor('f/scalar', 0, 1, found), CAIRN_OK, 'poll deleted scalar')
    call check(.not. found, 'deleted scalar is gone')
  end subroutine test_named_tensor_errors

  ! ---- the layout, seen from Python (tests/integration/test_fortran.py) ----

  subroutine test_layout()
    real(c_double) :: a(2, 3), from_python(2, 3), transposed(3, 2), expected(2, 3)
    integer :: i, j
    logical :: found
    ! Stored for Python, which must see a.T: shape (3, 2), element [j-1, i-1] = 10 i + j.
    do j = 1, 3
      do i = 1, 2
        a(i, j) = real(10 * i + j, c_double)
      end do
    end do
    call check_code(client%put_tensor('fortran/layout', a), CAIRN_OK, 'put fortran/layout for Python')
    ! Put by Python: np.arange(6.0).reshape(3, 2) * 1.5, i.e. element [r, c] = 1.5 (2 r + c).
    call check_code(client%tensor_exists('python/layout', found), CAIRN_OK, 'tensor_exists python/layout')
    if (.not. found) then
      write (*, '(a)') 'SKIP python layout (run by tests/integration/test_fortran.py, which puts python/layout)'
      return
    end if
    do j = 1, 3
      do i = 1, 2
        expected(i, j) = 1.5_c_double * real(2 * (j - 1) + (i - 1), c_double)
      end do
    end do
    from_python = -1
    call check_code(client%unpack_tensor('python/layout', from_python), CAIRN_OK, &
         'unpack a numpy (3,2) array into a Fortran (2,3) array')
    call check(all(from_python == expected), 'python layout: a(i,j) is numpy [j-1,i-1]')
    call check_code(client%unpack_tensor('python/layout', transposed), CAIRN_ERR_INVALID_ARGUMENT, &
         'unpack a numpy (3,2) array into a Fortran (3,2) array')
  end subroutine test_layout

  ! ---- models ----

  subroutine test_models()
    type(model_writer_type) :: writer
    type(model_reader_type) :: reader
    type(ticket_type) :: ticket
    real(c_float), target :: w1(4, 3), w1_back(4, 3)
    real(c_float) :: wrong(3, 4)
    real(c_double), target :: w2(3, 2, 2), w2_back(3, 2, 2)
    integer(c_int64_t) :: counts(2, 2, 2), counts_back(2, 2, 2)
    integer(c_int32_t) :: steps(5), steps_back(5)
    character(len=:), allocatable :: base, child, grand, json, name
    integer(c_int64_t), allocatable :: dims(:)
    integer(enum_kind) :: dtype
    integer :: i, n
    logical :: saw_w1, saw_w2
    base = 'f-base' // trim(suffix)
    child = 'f-child' // trim(suffix)
    grand = 'f-grand' // trim(suffix)
    w1 = reshape([(real(i, c_float) * 0.3_c_float, i = 1, 12)], [4, 3])
    w2 = reshape([(1.0_c_double / real(i, c_double), i = 1, 12)], [3, 2, 2])
    counts = reshape([(int(i, c_int64_t) * 2_c_int64_t**35, i = 1, 8)], [2, 2, 2])
    steps = [(int(i * 11, c_int32_t), i = 1, 5)]

    ! Handles not started.
    call check_code(writer%inherit_all(), CAIRN_ERR_INVALID_ARGUMENT, 'writer used before create')
    call check_code(ticket%wait(0), CAIRN_ERR_INVALID_ARGUMENT, 'wait on an empty ticket')
    call check_code(reader%read_tensor('x', w1_back), CAIRN_ERR_INVALID_ARGUMENT, 'reader used before open')

    ! The base: two tensors, metadata, committed global with a ticket.
    call check_code(writer%create(client, base), CAIRN_OK, 'model create ' // base)
    call check_code(writer%add_tensor('layer1.weight', w1), CAIRN_OK, 'add_tensor real32 (4,3)')
    call check_code(writer%add_tensor('counts', counts, shape(counts)), CAIRN_OK, 'add_tensor int64 (2,2,2)')
    call check_code(writer%set_metadata('{"score": 0.5, "task": "fortran"}'), CAIRN_OK, 'set_metadata')
    call check_code(writer%inherit_all(), CAIRN_ERR_INVALID_ARGUMENT, 'inherit_all without a parent')
    call check_code(writer%commit(CAIRN_DURABILITY_GLOBAL, ticket), CAIRN_OK, 'commit global with a ticket')
    call check_code(ticket%wait(-1), CAIRN_OK, 'wait for global')
    call ticket%free()
    call check_code(writer%add_tensor('late', w1), CAIRN_ERR_INVALID_ARGUMENT, 'writer used after commit')

    ! The child: inherits one tensor, adds another, committed global without a ticket.
    call check_code(writer%create(client, child, base), CAIRN_OK, 'model create ' // child // ' from ' // base)
    call check_code(writer%inherit_tensor('layer1.weight'), CAIRN_OK, 'inherit_tensor layer1.weight')
    call check_code(writer%add_tensor('layer2.weight', w2), CAIRN_OK, 'add_tensor real64 (3,2,2)')
    call check_code(writer%commit(CAIRN_DURABILITY_GLOBAL), CAIRN_OK, 'commit child global')

    ! Read the child back.
    call check_code(reader%open(client, child), CAIRN_OK, 'open ' // child)
    call check_code(reader%tensor_count(n), CAIRN_OK, 'tensor_count')
    call check(n == 2, 'the child has 2 tensors')
    saw_w1 = .false.
    saw_w2 = .false.
    do i = 1, n
      call check_code(reader%tensor_info(i, name, dtype, dims), CAIRN_OK, 'tensor_info ' // itoa(i))
      if (name == 'layer1.weight') saw_w1 = dtype == CAIRN_DTYPE_F32 .and. all(dims == shape(w1))
      if (name == 'layer2.weight') saw_w2 = dtype == CAIRN_DTYPE_F64 .and. all(dims == shape(w2))
    end do
    call check(saw_w1 .and. saw_w2, 'tensor_info: names, dtypes and Fortran shapes')
    call check_code(reader%tensor_info(0, name, dtype, dims), CAIRN_ERR_INVALID_ARGUMENT, 'tensor_info index 0')
    w1_back = 0
    w2_back = 0
    call check_code(reader%read_tensor('layer1.weight', w1_back), CAIRN_OK, 'read inherited layer1.weight')
    call check(same_bytes(c_loc(w1), c_loc(w1_back), int(storage_size(w1) / 8 * size(w1))), &
         'model round trip inherited tensor exact')
    call check_code(reader%read_tensor('layer2.weight', w2_back, shape(w2_back)), CAIRN_OK, 'read layer2.weight')
    call check(same_bytes(c_loc(w2), c_loc(w2_back), int(storage_size(w2) / 8 * size(w2))), &
         'model round trip added tensor exact')
    call check_code(reader%read_tensor('counts', counts_back), CAIRN_ERR_NOT_FOUND, 'read a tensor not inherited')
    call check_code(reader%read_tensor('layer1.weight', wrong), CAIRN_ERR_INVALID_ARGUMENT, 'read into a wrong shape')
    call check_code(reader%read_tensor('layer1.weight', w2_back), CAIRN_ERR_INVALID_ARGUMENT, 'read into a wrong kind')
    call check_code(reader%open(client, child), CAIRN_ERR_INVALID_ARGUMENT, 'open on an open reader')
    call reader%close()

    call check_code(reader%open(client, base), CAIRN_OK, 'open ' // base)
    counts_back = 0
    call check_code(reader%read_tensor('counts', counts_back), CAIRN_OK, 'read counts')
    call check(all(counts_back == counts), 'model round trip int64 exact')
    call reader%close()

    ! The parent link.
    call check_code(client%query('{"op":"ancestors","model":"' // child // '"}', json), CAIRN_OK, 'query ancestors')
    call check(index(json, '"' // base // '"') > 0, 'the child''s ancestors list the parent: ' // json)
    call check_code(client%request('{"op":"show","id":"' // child // '"}', json), CAIRN_OK, 'request show')
    call check(index(json, '"' // base // '"') > 0, 'show names the parent')

    ! A grandchild that inherits everything, pipelined (MEMORY with a ticket), plus a tensor.
    call check_code(writer%create(client, grand, child), CAIRN_OK, 'model create ' // grand)
    call check_code(writer%add_tensor('steps', steps), CAIRN_OK, 'add_tensor int32 (5)')
    call check_code(writer%inherit_all(), CAIRN_OK, 'inherit_all')
    call check_code(writer%commit(CAIRN_DURABILITY_MEMORY, ticket), CAIRN_OK, 'commit memory (pipelined)')
    call check_code(ticket%wait(-1), CAIRN_OK, 'wait for the pipelined commit')
    call ticket%free()
    call check_code(client%pipeline_flush(), CAIRN_OK, 'pipeline_flush')
    call check_code(reader%open(client, grand), CAIRN_OK, 'open ' // grand)
    call check_code(reader%tensor_count(n), CAIRN_OK, 'tensor_count ' // grand)
    call check(n == 3, 'inherit_all kept both parent tensors')
    steps_back = 0
    w2_back = 0
    call check_code(reader%read_tensor('steps', steps_back), CAIRN_OK, 'read steps')
    call check_code(reader%read_tensor('layer2.weight', w2_back), CAIRN_OK, 'read layer2.weight from ' // grand)
    saw_w2 = same_bytes(c_loc(w2), c_loc(w2_back), int(storage_size(w2) / 8 * size(w2)))
    call check(all(steps_back == steps) .and. saw_w2, 'model round trip int32 and inherited real64 exact')
    call reader%close()
    call check_code(client%prefetch(grand), CAIRN_OK, 'prefetch')
    call check_code(client%model_prefetch(grand), CAIRN_OK, 'model_prefetch')
    call check_code(client%model_prefetch('f-no-such-model'), CAIRN_ERR_NOT_FOUND, 'model_prefetch an unknown model')

    ! Commit options: with a ticket at MEMORY but not pipelined, the error comes from the call; with
    ! pipelined, from the ticket.
    call check_code(writer%create(client, grand, child), CAIRN_OK, 'model create ' // grand // ' again')
    call check_code(writer%commit(CAIRN_DURABILITY_MEMORY, ticket, pipelined=.false.), CAIRN_ERR_EXISTS, &
         'commit not pipelined: the error is the call''s')
    call check_code(writer%create(client, grand, child), CAIRN_OK, 'model create ' // grand // ' once more')
    call check_code(writer%commit(CAIRN_DURABILITY_GLOBAL, ticket, pipelined=.true.), CAIRN_OK, &
         'commit pipelined at global')
    call check_code(ticket%wait(-1), CAIRN_ERR_EXISTS, 'the pipelined commit''s error is the ticket''s')
    call ticket%free()

    ! Errors.
    call check_code(writer%create(client, base), CAIRN_OK, 'model create an existing id')
    call check_code(writer%add_tensor('layer1.weight', w1), CAIRN_OK, 'add_tensor to it')
    call check_code(writer%commit(CAIRN_DURABILITY_MEMORY), CAIRN_ERR_EXISTS, 'commit an existing id')
    call check_code(writer%create(client, 'f-aborted' // trim(suffix)), CAIRN_OK, 'model create f-aborted')
    call check_code(writer%create(client, 'f-other'), CAIRN_ERR_INVALID_ARGUMENT, 'create on a busy writer')
    call check_code(writer%add_tensor('layer1.weight', w1), CAIRN_OK, 'add_tensor to f-aborted')
    call writer%abort()
    call check_code(reader%open(client, 'f-aborted' // trim(suffix)), CAIRN_ERR_NOT_FOUND, 'an aborted model is not there')
    call check_code(reader%open(client, 'f-never-committed'), CAIRN_ERR_NOT_FOUND, 'open an unknown model')
    ! A missing parent fails at create, at inherit or at commit (whichever checks first).
    i = writer%create(client, 'f-orphan' // trim(suffix), 'f-no-such-parent')
    if (i == CAIRN_OK) i = writer%inherit_tensor('layer1.weight')
    if (i == CAIRN_OK) i = writer%commit(CAIRN_DURABILITY_GLOBAL)
    call writer%abort()
    n = len(cairn_last_error())
    call check(i /= CAIRN_OK .and. n > 0, 'a missing parent fails: ' // &
         cairn_status_string(i) // ': ' // cairn_last_error())
  end subroutine test_models

end program test_cairn
