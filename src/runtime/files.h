/* Whole files written for other processes to read (the binary cache, the program dump). Not
 * installed. */
#ifndef CLATTN_RUNTIME_FILES_H
#define CLATTN_RUNTIME_FILES_H

#include <stdbool.h>
#include <stddef.h>

/* Writes `size` bytes to `path` as a whole file: first under a name of its own, then renamed
 * over `path`, so that a reader sees the old file or the new one, never a part, and processes
 * sharing a directory are safe. False with the reason in `why` (`why_size` bytes). */
bool clattn__write_file(const char *path, const void *data, size_t size, char *why,
                        size_t why_size);

#endif
