/* shape_layout.h - the words of a `layout` made by tnt_shape_layout
 * (tarantella.h), for mismatch messages. */
#ifndef TNT_SHAPE_LAYOUT_H
#define TNT_SHAPE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "tarantella.h"

/* 1 when `layout` is one of tnt_shape_layout's (its low bits say so). */
int tnt_shape_layout_is_shape(uint64_t layout);
/* "shape (2, 3)", or for a shape too large to hold exactly "a 12-dimensional
 * shape (digest ...)", into out: 1; else "" and 0 (not a shape's layout). */
int tnt_shape_layout_text(uint64_t layout, char *out, size_t len);

#endif
