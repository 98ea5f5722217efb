/* Unit test for common/list.h: FIFO order, head and tail kept right;
 * unlinking the first, a middle and the last item of a doubly linked
 * list. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>

#include "common/list.h"

struct item {
    int v;
    struct item *next;
};

struct ditem {
    int v;
    struct ditem *up, *down;      /* names of the list's choosing */
};

static void test_unlink(void)
{
    struct ditem d[4], *head = &d[0];

    for (int i = 0; i < 4; i++)
        d[i] = (struct ditem){ .v = i, .up = i ? &d[i - 1] : NULL,
                               .down = i < 3 ? &d[i + 1] : NULL };
    DLIST_UNLINK(head, &d[1], up, down);          /* middle */
    assert(head == &d[0] && d[0].down == &d[2] && d[2].up == &d[0]);
    DLIST_UNLINK(head, &d[0], up, down);          /* first */
    assert(head == &d[2] && d[2].up == NULL);
    DLIST_UNLINK(head, &d[3], up, down);          /* last */
    assert(head == &d[2] && d[2].down == NULL);
    DLIST_UNLINK(head, &d[2], up, down);          /* the only one */
    assert(head == NULL);
}

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
    test_unlink();
    printf("list: ok\n");
    return 0;
}
