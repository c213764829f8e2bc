/* crc32c.h: CRC32C (Castagnoli), the one checksum of both programs (the
 * proto_ prefix: the client library exports it with the rest of proto/): the
 * daemon's stored rows (daemon/integrity.h) and the client's spool records
 * (telemetry/spool.c, spool_read.c). Pure: no I/O; a table built once per process. */
#ifndef CRC32C_H
#define CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of n bytes at p, continuing crc (0 to start; a CRC of a whole is
 * the CRC of its second part continued from the first's): SSE4.2's crc32
 * instruction where the CPU has it, else a table (slice-by-8); both give
 * the same value ("123456789" gives 0xE3069283). Any thread. */
uint32_t proto_crc32c(uint32_t crc, const void *p, size_t n);

/* The table's CRC, whatever the CPU (for the tests comparing the two). */
uint32_t proto_crc32c_soft(uint32_t crc, const void *p, size_t n);

#endif
