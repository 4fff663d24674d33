# A stand-in bcryptprimitives.dll for Wine < 8.13, which lacks
# ProcessPrng; Go's runtime (1.24+) will not start without it.
# BOOL ProcessPrng(PBYTE rcx, SIZE_T rdx) fills the buffer with
# advapi32!SystemFunction036 (RtlGenRandom), at most 256 MiB a call.
# Built by .ci/wine with binutils-mingw-w64-x86-64; used only for tests.
	.text
	.globl	ProcessPrng
ProcessPrng:
	pushq	%rbx
	pushq	%rsi
	subq	$40, %rsp
	movq	%rcx, %rbx
	movq	%rdx, %rsi
1:	testq	%rsi, %rsi
	jz	2f
	movl	$0x10000000, %edx
	cmpq	%rdx, %rsi
	cmovbq	%rsi, %rdx
	movq	%rbx, %rcx
	subq	%rdx, %rsi
	addq	%rdx, %rbx
	call	*__imp_SystemFunction036(%rip)
	testb	%al, %al
	jnz	1b
	xorl	%eax, %eax
	jmp	3f
2:	movl	$1, %eax
3:	addq	$40, %rsp
	popq	%rsi
	popq	%rbx
	ret
	.globl	DllEntry
DllEntry:
	movl	$1, %eax
	ret
