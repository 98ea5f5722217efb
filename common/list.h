/* common/list.h: append to a singly linked FIFO kept as a head and a tail
 * pointer (the item's link field is named next); unlink from a doubly
 * linked list kept as a head pointer.  The caller holds whatever lock
 * guards the list. */
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

/* Unlink item from a doubly linked list whose first item is head, the
 * item's link fields named prev and next (lists name them as they
 * like).  The item's own links are left as they were; a list that keeps
 * a tail updates it itself (item was the tail if item->next is NULL). */
#define DLIST_UNLINK(head, item, prev, next)                                 \
    do {                                                                     \
        if ((item)->prev)                                                    \
            (item)->prev->next = (item)->next;                               \
        else                                                                 \
            (head) = (item)->next;                                           \
        if ((item)->next)                                                    \
            (item)->next->prev = (item)->prev;                               \
    } while (0)
