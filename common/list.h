/* common/list.h: append to a singly linked FIFO kept as a head and a tail
 * pointer (the item's link field is named next).  The caller holds
 * whatever lock guards the list. */
#pragma once
#include <stddef.h>

#define QUEUE_APPEND(head, tail, item)                                       \
    do {                                                                     \
        (item)->next = NULL;                                                 \
        if (tail)                                                            \
            (tail)->next = (item);                                           \
        else                                                                 \
            (head) = (item);                                                 \
        (tail) = (item);                                                     \
    } while (0)
