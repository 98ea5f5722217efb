/* Unit test for common/list.h: FIFO order, head and tail kept right. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>

#include "common/list.h"

struct item {
    int v;
    struct item *next;
};

int main(void)
{
    struct item it[5];
    struct item *head = NULL, *tail = NULL;

    for (int i = 0; i < 5; i++) {
        it[i] = (struct item){ .v = i, .next = &it[0] };   /* stale link */
        QUEUE_APPEND(head, tail, &it[i]);
        assert(head == &it[0] && tail == &it[i] && tail->next == NULL);
    }
    int n = 0;
    for (struct item *p = head; p; p = p->next)
        assert(p->v == n++);
    assert(n == 5);

    /* Drained to empty and refilled: head is set again. */
    head = tail = NULL;
    QUEUE_APPEND(head, tail, &it[3]);
    assert(head == &it[3] && tail == &it[3] && !it[3].next);
    printf("list: ok\n");
    return 0;
}
